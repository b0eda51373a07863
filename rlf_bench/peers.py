"""``rlf-bench env --compare``: our vector env beside GEM and verifiers on the same tool workload.

Every driver runs the env bench's workload: ``N`` episodes, and in each step every episode makes
one call of the latency server's ``sleep`` tool (``L`` ms). Ours and the sequential loop come from
:func:`~rlf_bench.env_bench.run_env_bench`; each peer runs in its own venv
(``.venv-peers/<peer>``, made by ``scripts/setup_peer_venvs.sh``) through a driver script in
:mod:`rlf_bench.peer_drivers`, against a latency server of its own, and reports one JSON line.
A peer that is not installed, fails or times out gets a row that says why instead of a number.

Example:
    >>> report = run_compare(BenchSettings(latency_ms=100, steps=5), [16, 64])   # doctest: +SKIP
    >>> print(format_compare(report))                                           # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlf_bench.env_bench import LATENCY_MODULE, BenchSettings, latency_servers, run_env_bench
from rlf_envs.info_keys import ERRORS
from rlf_envs.servers.launch import PACKAGE_ROOT, stdio_server_entry

DRIVERS_DIR = Path(__file__).resolve().with_name("peer_drivers")  # shipped inside the package
# where scripts/setup_peer_venvs.sh puts the peers: $RLF_PEER_VENVS, else ./.venv-peers (the
# folder the benchmark runs from), as in the script; nothing assumes a source checkout
DEFAULT_VENVS_DIR = Path(os.environ.get("RLF_PEER_VENVS", ".venv-peers")).absolute()
OURS = "rlf vector env"
OURS_ASYNC = "rlf astep_one"
SEQUENTIAL = "rlf sequential loop"
ACTION = '<tool_call>{"name": "sleep", "arguments": {}}</tool_call>'


@dataclass(frozen=True)
class Peer:
    """A peer framework: where its venv lives, the script that drives it, what it can talk to."""

    name: str
    package: str
    driver: str
    transports: tuple[str, ...]
    job_defaults: tuple[tuple[str, Any], ...] = ()


PEERS: dict[str, Peer] = {
    "gem": Peer("gem", "gem-llm==0.1.0", "gem_driver.py", ("stdio", "http"), (("tool_layout", "per_env"),)),
    "verifiers": Peer("verifiers", "verifiers==0.4.0", "verifiers_driver.py", ("http",)),
}


class PeerUnavailable(RuntimeError):
    """A peer cannot be run here (not installed); the message says what to do."""


def peer_python(peer: Peer, venvs_dir: Path = DEFAULT_VENVS_DIR) -> Path:
    """The peer venv's interpreter; raises :class:`PeerUnavailable` if the venv was never made."""
    python = Path(venvs_dir) / peer.name / "bin" / "python"
    if not python.exists():
        raise PeerUnavailable(
            f"not installed: no {python} (run scripts/setup_peer_venvs.sh to pip install {peer.package})"
        )
    return python


def _last_json_line(text: str) -> dict[str, Any] | None:
    # peers print their own banners to stdout (GEM announces its vector env); the figures are the last JSON line
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)
    return None


def run_peer_driver(
    peer: Peer, job: dict[str, Any], *, venvs_dir: Path = DEFAULT_VENVS_DIR, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Run ``peer``'s driver on ``job`` in its venv; the driver's figures, or ``{"error": why}``.

    Example:
        >>> run_peer_driver(PEERS["gem"], {"server": {"url": url}, "num_envs": 4, "steps": 2})  # doctest: +SKIP
        {'peer': 'gem', 'steps_per_s': ..., 'errors': 0, ...}
    """
    try:
        python = peer_python(peer, venvs_dir)
    except PeerUnavailable as exc:
        return {"error": str(exc)}
    command = [str(python), str(DRIVERS_DIR / peer.driver), json.dumps({**dict(peer.job_defaults), **job})]
    # a session of its own, so a timeout takes down whatever the driver spawned too
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"timed out after {timeout_s:g} s"}
    result = _last_json_line(stdout)
    if result is None:
        tail = (stderr or stdout).strip().splitlines()[-3:]
        return {"error": f"driver exited {proc.returncode} without figures: {' | '.join(tail)[-400:]}"}
    if proc.returncode != 0 and "error" not in result:
        result["error"] = f"driver exited {proc.returncode}"
    return result


def _stdio_server_entry(settings: BenchSettings) -> dict[str, Any]:
    """The ``mcpServers`` entry that has a peer spawn our latency server over stdio."""
    # the driver's python is the peer's; the server runs with ours (sys.executable) and must find
    # rlf_envs wherever it is installed: stdio_server_entry puts its folder on PYTHONPATH
    args = ["--latency-ms", str(settings.latency_ms), "--jitter-ms", str(settings.jitter_ms)]
    return stdio_server_entry(LATENCY_MODULE, args, cwd=PACKAGE_ROOT)


@contextlib.contextmanager
def _peer_server(settings: BenchSettings, transport: str) -> Iterator[dict[str, Any]]:
    """A fresh latency server for one peer run (HTTP: started here; stdio: the peer spawns it)."""
    if transport == "stdio":
        yield _stdio_server_entry(settings)
        return
    with latency_servers(dataclasses.replace(settings, transport="http", replicas=1)) as config:
        yield {"url": config["mcpServers"]["latency"]["url"]}


def run_peer(
    peer: Peer,
    settings: BenchSettings,
    *,
    venvs_dir: Path = DEFAULT_VENVS_DIR,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """One peer at ``settings.num_envs``: its figures plus the transport used, or an ``error``.

    A peer that cannot speak ``settings.transport`` runs over HTTP and its row says so.
    """
    transport = settings.transport if settings.transport in peer.transports else peer.transports[0]
    note = (
        ""
        if transport == settings.transport
        else f"over {transport}: {peer.name}'s MCP client has no {settings.transport}"
    )
    try:
        peer_python(peer, venvs_dir)
    except PeerUnavailable as exc:
        return {"error": str(exc), "transport": transport, "note": note}
    job = {
        "num_envs": settings.num_envs,
        "steps": settings.steps,
        "latency_ms": settings.latency_ms,
        "timeout_s": 60 + settings.latency_ms / 1000 * 4,
    }
    with _peer_server(settings, transport) as server:
        result = run_peer_driver(peer, {**job, "server": server}, venvs_dir=venvs_dir, timeout_s=timeout_s)
    return {**result, "transport": transport, "note": note}


def run_ours_async(settings: BenchSettings) -> dict[str, Any]:
    """Our vector env driven through its async API: N independent episodes, no step barrier.

    Each env is stepped with ``astep_one`` as soon as its previous step returns, the way a trainer
    that generates asynchronously uses it (and the way verifiers' rollouts run: each on its own).
    """
    import asyncio

    import gymnasium as gym

    import rlf_envs  # noqa: F401  (registers ids)
    from rlf_envs.loop_thread import LoopThread

    with latency_servers(settings) as config:
        envs = gym.make_vec(
            "RLF/ToolUse-v0",
            num_envs=settings.num_envs,
            tasks=[{"question": "benchmark"}],
            mcp_servers=config,
            max_turns=settings.steps + 3,
            autoreset_mode="Disabled",
        )
        driver = LoopThread("rlf-bench-async")
        try:
            vec = envs.unwrapped
            envs.reset(seed=0)
            envs.step([ACTION] * settings.num_envs)  # warm-up, as in run_env_bench

            async def episode(i: int) -> int:
                errors = 0
                for _ in range(settings.steps):
                    *_, info = await vec.astep_one(i, ACTION)
                    errors += len(info.get(ERRORS, []))
                return errors

            async def all_episodes() -> tuple[float, int]:
                started = time.perf_counter()
                errors = await asyncio.gather(*(episode(i) for i in range(settings.num_envs)))
                return time.perf_counter() - started, sum(errors)

            wall, errors = driver.run(all_episodes())
        finally:
            driver.close()
            envs.close()
    return {"steps_per_s": settings.num_envs * settings.steps / wall, "wall_s": wall, "errors": errors}


def _load_1m() -> float:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")


def _row(
    num_envs: int, driver: str, steps_per_s: float | None, ours: float | None, **extra: Any
) -> dict[str, Any]:
    ratio = steps_per_s / ours if steps_per_s and ours else None
    return {
        "num_envs": num_envs,
        "driver": driver,
        "steps_per_s": steps_per_s,
        "ratio_to_ours": ratio,
        "ours_speedup": 1 / ratio if ratio else None,
        **extra,
    }


def run_compare(
    settings: BenchSettings,
    num_envs_list: Sequence[int],
    *,
    peers: Sequence[str] = ("verifiers", "gem"),
    venvs_dir: str | os.PathLike[str] = DEFAULT_VENVS_DIR,
    peer_timeout_s: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Ours, the sequential loop and each peer at each ``num_envs``: steps/s and ratio to ours.

    Returns ``{"settings", "machine", "rows": [{num_envs, driver, steps_per_s, ratio_to_ours,
    ours_speedup, note, error?, ...}]}``; ``ratio_to_ours`` is the driver's steps/s over ours.

    Example:
        >>> report = run_compare(BenchSettings(latency_ms=100), [64])                 # doctest: +SKIP
        >>> [(r["driver"], round(r["ours_speedup"] or 0, 1)) for r in report["rows"]]  # doctest: +SKIP
        [('rlf vector env', 1.0), ('rlf sequential loop', 17.2), ('gem', 9.5), ('verifiers', 2.4)]
    """
    say = progress or (lambda _message: None)
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; known: {sorted(PEERS)}")
    rows: list[dict[str, Any]] = []
    for num_envs in num_envs_list:
        at_n = dataclasses.replace(settings, num_envs=num_envs)
        ours_rows = _our_rows(at_n, say)
        rows += ours_rows
        ours = ours_rows[0]["steps_per_s"]
        for name in peers:
            say(f"[compare] N={num_envs}: {name}")
            rows.append(_peer_row(name, at_n, ours, Path(venvs_dir), peer_timeout_s))
    return {"settings": dataclasses.asdict(settings), "machine": machine_info(), "rows": rows}


def _our_rows(settings: BenchSettings, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The rows of our vector env (first), the sequential loop and ``astep_one`` at ``settings.num_envs``."""
    num_envs = settings.num_envs
    transport = f"{settings.transport} x{settings.replicas}"
    say(f"[compare] N={num_envs}: rlf vector env + sequential loop")
    load = _load_1m()
    report = run_env_bench(settings)
    ours = report["env_steps_per_s"]
    rows = [
        _row(num_envs, OURS, ours, ours, transport=transport, wall_s=report["env_wall_s"],
             errors=report["tool_errors"], note="", load_1m=load),
        _row(num_envs, SEQUENTIAL, report["sequential_steps_per_s"], ours, transport=transport,
             note=f"scaled from {report['sequential_calls_measured']} calls"),
    ]  # fmt: skip
    say(f"[compare] N={num_envs}: rlf astep_one")
    load = _load_1m()
    ours_async = run_ours_async(settings)
    rows.append(
        _row(num_envs, OURS_ASYNC, ours_async["steps_per_s"], ours, transport=transport,
             wall_s=ours_async["wall_s"], errors=ours_async["errors"], note="async API, no step barrier",
             load_1m=load)
    )  # fmt: skip
    return rows


def _peer_row(
    name: str, settings: BenchSettings, ours: float, venvs_dir: Path, timeout_s: float
) -> dict[str, Any]:
    """Peer ``name``'s row at ``settings.num_envs`` (its error, if it failed), relative to ``ours``."""
    started = time.perf_counter()
    load = _load_1m()
    result = run_peer(PEERS[name], settings, venvs_dir=venvs_dir, timeout_s=timeout_s)
    extra = {
        k: result[k]
        for k in ("version", "wall_s", "setup_s", "errors", "tool_layout", "error")
        if k in result
    }
    return _row(
        settings.num_envs,
        name,
        None if "error" in result else result.get("steps_per_s"),
        ours,
        transport=result.get("transport", ""),
        note=result.get("note", ""),
        run_s=time.perf_counter() - started,
        load_1m=load,
        **extra,
    )


def machine_info() -> dict[str, Any]:
    """What the figures were measured on (the load average matters on a shared box)."""
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "loadavg_1m": _load_1m(),
    }


def format_compare(report: dict[str, Any]) -> str:
    """The compare table as text: one line per (num_envs, driver); a failed peer shows why."""
    s = report["settings"]
    machine = report.get("machine", {})
    lines = [
        f"env compare: {s['steps']} steps x {s['latency_ms']:g} ms tool latency, {s['transport']} x{s['replicas']}"
        f"   ({machine.get('cpus', '?')} CPUs; load: 1-min load average as each row started)",
        f"  {'N':>5}  {'driver':<22} {'steps/s':>10} {'ratio':>8} {'ours is':>9}  notes",
    ]
    for row in report["rows"]:
        if row["steps_per_s"] is None:
            figures = f"{'-':>10} {'-':>8} {'-':>9}"
            why = row.get("error") or "no figure"
            notes = f"{why}" + (f"; {row['note']}" if row.get("note") else "")
        else:
            ratio = row["ratio_to_ours"]
            speedup = row["ours_speedup"]
            figures = f"{row['steps_per_s']:10.1f} {ratio:7.3f}x {speedup:8.1f}x"
            parts = [p for p in (row.get("transport"), row.get("note")) if p]
            if row.get("errors"):
                parts.append(f"{row['errors']} tool errors")
            if row.get("load_1m") is not None:
                parts.append(f"load {row['load_1m']:g}")
            notes = "; ".join(parts)
        lines.append(f"  {row['num_envs']:>5}  {row['driver']:<22} {figures}  {notes}")
    return "\n".join(lines)
