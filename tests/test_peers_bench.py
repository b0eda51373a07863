"""The peer benchmark (``rlf-bench env --compare``): rows, failures that explain themselves, the plot.

Peers run in their own venvs (``scripts/setup_peer_venvs.sh``); the tests that drive a real peer are
skipped when its venv is missing, the rest run everywhere.
"""

import asyncio
import json
import math
import os
import sys
import textwrap
import time

import pytest

from rlf_bench.env_bench import BenchSettings
from rlf_bench.peers import (
    DEFAULT_VENVS_DIR,
    OURS,
    OURS_ASYNC,
    PEERS,
    SEQUENTIAL,
    Peer,
    format_compare,
    run_compare,
    run_peer,
    run_peer_driver,
)
from rlf_bench.plot import plot_compare, series
from tests.helpers import free_local_port, http_server, pid_alive

SMALL = BenchSettings(num_envs=4, latency_ms=20, steps=2, sequential_calls=4)


def _fake_venv(root, peer_name):
    """A peer venv whose python is ours: the interpreter runs, the peer package is missing."""
    bin_dir = root / peer_name / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    return root


def test_compare_without_peer_venvs_has_our_figures_and_says_why_peers_are_missing(tmp_path):
    report = run_compare(SMALL, [4], venvs_dir=tmp_path)
    rows = {row["driver"]: row for row in report["rows"]}
    assert set(rows) == {OURS, OURS_ASYNC, SEQUENTIAL, "gem", "verifiers"}
    for driver in (OURS, OURS_ASYNC, SEQUENTIAL):  # measured figures, whatever their size
        assert math.isfinite(rows[driver]["steps_per_s"]) and rows[driver]["num_envs"] == 4
    assert (
        rows[OURS]["ratio_to_ours"] == 1.0 and rows[OURS]["errors"] == 0 and rows[OURS_ASYNC]["errors"] == 0
    )
    # the ratios are the measured steps/s over each other (their size is the benchmark's to print)
    ratio = rows[SEQUENTIAL]["steps_per_s"] / rows[OURS]["steps_per_s"]
    assert rows[SEQUENTIAL]["ratio_to_ours"] == pytest.approx(ratio)
    assert rows[SEQUENTIAL]["ours_speedup"] == pytest.approx(1 / ratio)
    for peer in ("gem", "verifiers"):
        assert rows[peer]["steps_per_s"] is None and rows[peer]["ratio_to_ours"] is None
        assert "not installed" in rows[peer]["error"] and "setup_peer_venvs.sh" in rows[peer]["error"]
    assert "over http" in rows["verifiers"]["note"]  # stdio asked, verifiers' client is HTTP only
    text = format_compare(report)
    assert text.count("not installed") == 2 and OURS in text
    json.dumps(report)  # the CLI prints it as the --json line


def test_peer_whose_package_is_missing_reports_the_import_error(tmp_path):
    venvs = _fake_venv(tmp_path, "gem")
    result = run_peer(
        PEERS["gem"], BenchSettings(num_envs=2, latency_ms=10, steps=1, transport="http"), venvs_dir=venvs
    )
    assert result["transport"] == "http"
    assert "ModuleNotFoundError" in result["error"] and "gem" in result["error"]


def test_hung_driver_is_killed_with_what_it_spawned(tmp_path):
    pids = tmp_path / "pids.json"
    script = tmp_path / "hang.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, subprocess, sys, time
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open({str(pids)!r}, "w").write(json.dumps([child.pid]))
            time.sleep(600)
            """
        )
    )
    venvs = _fake_venv(tmp_path / "venvs", "hang")
    peer = Peer("hang", "nothing", str(script), ("http",))
    result = run_peer_driver(peer, {"num_envs": 1}, venvs_dir=venvs, timeout_s=3)
    assert result == {"error": "timed out after 3 s"}
    (child_pid,) = json.loads(pids.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(child_pid)


def test_plot_draws_every_driver_with_a_figure(tmp_path):
    rows = [
        {"num_envs": n, "driver": d, "steps_per_s": v}
        for n, d, v in [
            (16, OURS, 100.0),
            (64, OURS, 300.0),
            (16, "gem", 10.0),
            (64, "gem", 12.0),
            (64, "verifiers", None),
        ]
    ]
    report = {"settings": SMALL.__dict__ | {"transport": "stdio"}, "machine": {"cpus": 2}, "rows": rows}
    assert series(report) == {OURS: [(16, 100.0), (64, 300.0)], "gem": [(16, 10.0), (64, 12.0)]}
    out = plot_compare(report, tmp_path / "plots" / "envs.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    two = plot_compare([report, report], tmp_path / "two.png")
    assert two.read_bytes()[16:20] > out.read_bytes()[16:20]  # PNG width: one panel per report
    with pytest.raises(ValueError, match="no steps/s figure"):
        plot_compare({**report, "rows": rows[-1:]}, tmp_path / "empty.png")


# ---------------------------------------------------------------------------- real peers


def _server_stats(url):
    from mcp import Client

    async def read():
        async with Client(url) as client:
            result = await client.call_tool("stats", {})
            return result.structured_content

    return asyncio.run(read())


def _needs(peer_name):
    return pytest.mark.skipif(
        not (DEFAULT_VENVS_DIR / peer_name / "bin" / "python").exists(),
        reason=f"no {peer_name} venv: run scripts/setup_peer_venvs.sh",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("peer_name", "warmup_steps"),
    [pytest.param("gem", 1, marks=_needs("gem")), pytest.param("verifiers", 0, marks=_needs("verifiers"))],
)
def test_real_peer_makes_every_call_through_its_own_stack(peer_name, warmup_steps):
    num_envs, steps = 4, 2
    port = free_local_port()
    argv = [sys.executable, "-m", "rlf_envs.servers.latency", "--latency-ms", "50"]
    with http_server(argv, port):
        url = f"http://127.0.0.1:{port}/mcp"
        job = {"server": {"url": url}, "num_envs": num_envs, "steps": steps}
        result = run_peer_driver(PEERS[peer_name], job, timeout_s=240)
        assert "error" not in result, result.get("traceback", result)
        stats = _server_stats(url)
    assert result["peer"] == peer_name and result["errors"] == 0 and math.isfinite(result["steps_per_s"])
    assert "slept" in result["sample_obs"]
    assert stats["calls"] == num_envs * (steps + warmup_steps)
    # the calls of one step overlap: more than one in flight at once
    assert stats["peak_in_flight"] > 1


@pytest.mark.slow
@_needs("gem")
def test_compare_row_for_an_installed_peer_has_a_ratio(tmp_path):
    report = run_compare(
        BenchSettings(num_envs=4, latency_ms=20, steps=2, sequential_calls=4, transport="http"),
        [4],
        peers=["gem"],
    )
    gem = next(row for row in report["rows"] if row["driver"] == "gem")
    ours = next(row for row in report["rows"] if row["driver"] == OURS)
    assert (
        gem["ratio_to_ours"] == pytest.approx(gem["steps_per_s"] / ours["steps_per_s"]) and gem["errors"] == 0
    )
    assert gem["version"] == "0.1.0" and gem["transport"] == "http"
    assert os.path.basename(str(gem.get("tool_layout"))) == "per_env"
