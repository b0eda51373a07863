"""The env benchmark: our vector env vs a sequential loop vs the raw MCP SDK, on one latency server.

Every env's action in every step is one call of the shipped latency server's ``sleep`` tool
(``L`` ms). Three drivers run the same calls:

- **env**: ``ToolVectorEnv.step`` over ``N`` envs for ``S`` steps (all calls of a step in flight at once);
- **sequential**: the same env stack, one call at a time (``astep_one`` awaited in turn), run for
  fewer calls and scaled to ``N x S``;
- **sdk floor**: the same calls straight through ``mcp.Client`` sessions with ``asyncio.gather``, no env
  (``floor_sessions`` sessions, default 1: what a plain MCP client does; the env's ``replicas`` may
  beat it by spreading the server side over processes).

Example:
    >>> report = run_env_bench(BenchSettings(num_envs=8, latency_ms=10, steps=2))   # doctest: +SKIP
    >>> report["speedup_vs_sequential"] > 1                                        # doctest: +SKIP
    True
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from rlf_envs.info_keys import TOOL_CALLS
from rlf_envs.loop_thread import LoopThread
from rlf_envs.ports import free_local_port

LATENCY_MODULE = "rlf_envs.servers.latency"


@dataclass(frozen=True)
class BenchSettings:
    num_envs: int = 64
    latency_ms: float = 100.0
    steps: int = 5
    transport: str = "stdio"
    replicas: int = 1
    jitter_ms: float = 0.0
    sequential_calls: int = 32
    calls_per_step: int = 1
    floor_sessions: int = 1  # the raw-SDK floor: how a plain MCP client runs, one session per server
    repeats: int = 3  # timed rounds of `steps` steps for the env and for the floor; medians are reported


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"latency server exited early with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"latency server did not listen on port {port} within {timeout_s}s")


def _server_args(settings: BenchSettings) -> list[str]:
    return [
        "-m",
        LATENCY_MODULE,
        "--latency-ms",
        str(settings.latency_ms),
        "--jitter-ms",
        str(settings.jitter_ms),
    ]


@contextlib.contextmanager
def latency_servers(settings: BenchSettings) -> Iterator[dict[str, Any]]:
    """The ``mcpServers`` config of the latency server; HTTP servers are started here (one per replica)."""
    entry: dict[str, Any] = {"timeout_s": 60 + settings.latency_ms / 1000 * 4}
    if settings.transport == "stdio":
        entry |= {"command": sys.executable, "args": _server_args(settings), "replicas": settings.replicas}
        yield {"mcpServers": {"latency": entry}}
        return
    if settings.transport != "http":
        raise ValueError(f"transport must be 'stdio' or 'http', got {settings.transport!r}")
    port = free_local_port()
    cmd = [sys.executable, *_server_args(settings), "--transport", "http", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(port, proc)
        entry |= {"url": f"http://127.0.0.1:{port}/mcp", "replicas": settings.replicas}
        yield {"mcpServers": {"latency": entry}}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _action(settings: BenchSettings) -> str:
    call = '<tool_call>{"name": "sleep", "arguments": {}}</tool_call>'
    return call * settings.calls_per_step


async def _sdk_floor(config: dict[str, Any], settings: BenchSettings) -> list[float]:
    """Wall times (one per round) of the bench's calls gathered straight on ``mcp.Client`` sessions."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    entry = config["mcpServers"]["latency"]
    async with contextlib.AsyncExitStack() as stack:
        clients = []
        for _ in range(settings.floor_sessions):
            # errlog given now: the SDK's default is the sys.stderr of its first import, which a
            # test's capture may have closed since
            target = (
                entry["url"]
                if "url" in entry
                else stdio_client(
                    StdioServerParameters(command=entry["command"], args=entry["args"]), errlog=sys.stderr
                )
            )
            clients.append(await stack.enter_async_context(Client(target)))
        await asyncio.gather(*(c.call_tool("sleep", {"ms": 0}) for c in clients))
        calls = settings.num_envs * settings.calls_per_step
        walls = []
        for _ in range(settings.repeats):
            started = time.perf_counter()
            for _ in range(settings.steps):
                await asyncio.gather(
                    *(clients[k % len(clients)].call_tool("sleep", {}) for k in range(calls))
                )
            walls.append(time.perf_counter() - started)
        return walls


def run_env_bench(settings: BenchSettings) -> dict[str, Any]:
    """Run the three drivers and return the figures (see the module docs)."""
    import gymnasium as gym

    import rlf_envs  # noqa: F401  (registers ids)

    action = _action(settings)
    with latency_servers(settings) as config:
        envs = gym.make_vec(
            "RLF/ToolUse-v0",
            num_envs=settings.num_envs,
            tasks=[{"question": "benchmark"}],
            mcp_servers=config,
            max_turns=settings.repeats * settings.steps + 3,
            max_calls_per_turn=max(16, settings.calls_per_step),
            autoreset_mode="Disabled",
        )
        try:
            env_walls, latencies, errors = _vector_steps(envs, action, settings)
            seq_measured, seq_calls = _sequential_steps(envs, action, settings)
        finally:
            envs.close()
        floor_wall = LoopThread("rlf-bench-floor")
        try:
            sdk_walls = floor_wall.run(_sdk_floor(config, settings))
        finally:
            floor_wall.close()
    return _figures(settings, env_walls, latencies, errors, seq_measured / seq_calls, seq_calls, sdk_walls)


def _vector_steps(envs: Any, action: str, settings: BenchSettings) -> tuple[list[float], list[float], int]:
    """The vector env's wall per repeat of ``steps`` batched steps, every call's latency, the failed calls."""
    envs.reset(seed=0)
    envs.step([action] * settings.num_envs)  # warm-up: sessions, caches, first-call costs
    latencies: list[float] = []
    errors = 0
    env_walls = []
    for _ in range(settings.repeats):
        started = time.perf_counter()
        for _ in range(settings.steps):
            _, _, _, _, infos = envs.step([action] * settings.num_envs)
            for records in infos[TOOL_CALLS]:
                latencies += [r["latency_s"] for r in records]
                errors += sum(1 for r in records if not r["ok"])
        env_walls.append(time.perf_counter() - started)
    return env_walls, latencies, errors


def _sequential_steps(envs: Any, action: str, settings: BenchSettings) -> tuple[float, int]:
    """The wall of ``sequential_calls`` env steps one after another (no overlap), and how many ran."""
    envs.reset(seed=0)
    vec = envs.unwrapped
    seq_calls = min(settings.sequential_calls, settings.num_envs * settings.steps)
    driver = LoopThread("rlf-bench-sequential")
    try:

        async def sequential() -> float:
            begin = time.perf_counter()
            for k in range(seq_calls):
                await vec.astep_one(k % settings.num_envs, action)
            return time.perf_counter() - begin

        return driver.run(sequential()), seq_calls
    finally:
        driver.close()


def _figures(
    settings: BenchSettings,
    env_walls: list[float],
    latencies: list[float],
    errors: int,
    seq_step_s: float,
    seq_calls: int,
    sdk_walls: list[float],
) -> dict[str, Any]:
    env_wall, sdk_wall = float(np.median(env_walls)), float(np.median(sdk_walls))
    total_steps = settings.num_envs * settings.steps
    seq_wall = seq_step_s * total_steps
    ideal_wall = settings.steps * settings.latency_ms / 1000
    lat = np.asarray(latencies) * 1000 if latencies else np.zeros(1)
    return {
        "settings": asdict(settings),
        "env_steps_per_s": total_steps / env_wall,
        "env_wall_s": env_wall,
        "call_latency_p50_ms": float(np.percentile(lat, 50)),
        "call_latency_p99_ms": float(np.percentile(lat, 99)),
        "tool_errors": errors,
        "sequential_steps_per_s": total_steps / seq_wall,
        "sequential_wall_s_scaled": seq_wall,
        "sequential_calls_measured": seq_calls,
        "speedup_vs_sequential": seq_wall / env_wall,
        "ideal_wall_s": ideal_wall,
        "overlap_efficiency": ideal_wall / env_wall,
        "sdk_floor_wall_s": sdk_wall,
        "env_walls_s": env_walls,
        "sdk_floor_walls_s": sdk_walls,
        "sdk_floor_ratio": env_wall / sdk_wall,
    }


def format_report(report: dict[str, Any]) -> str:
    """A human-readable summary of :func:`run_env_bench`'s figures."""
    s = report["settings"]
    lines = [
        f"env bench: {s['num_envs']} envs x {s['steps']} steps, {s['latency_ms']:g} ms tool latency, "
        f"{s['transport']} x{s['replicas']}; median of {s['repeats']} rounds",
        f"  vector env      {report['env_steps_per_s']:10.1f} env-steps/s   wall {report['env_wall_s']:.3f} s   "
        f"p50 {report['call_latency_p50_ms']:.1f} ms  p99 {report['call_latency_p99_ms']:.1f} ms  "
        f"errors {report['tool_errors']}",
        f"  sequential loop {report['sequential_steps_per_s']:10.1f} env-steps/s   wall {report['sequential_wall_s_scaled']:.1f} s "
        f"(scaled from {report['sequential_calls_measured']} calls)",
        f"  raw MCP SDK     wall {report['sdk_floor_wall_s']:.3f} s (asyncio.gather on {s['floor_sessions']} open session(s))",
        f"  speedup_vs_sequential {report['speedup_vs_sequential']:.1f}x   overlap_efficiency "
        f"{report['overlap_efficiency']:.3f}   sdk_floor_ratio {report['sdk_floor_ratio']:.3f}",
    ]
    return "\n".join(lines)
