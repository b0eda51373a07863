"""``rlf-bench``: the dispatcher and ``env``'s --json contract, on a real latency server."""

import json

from rlf_bench.cli import main

KEYS = {
    "env_steps_per_s",
    "call_latency_p50_ms",
    "call_latency_p99_ms",
    "sequential_steps_per_s",
    "speedup_vs_sequential",
    "overlap_efficiency",
    "sdk_floor_ratio",
}


def test_env_json_last_line_has_every_figure(capfd):
    argv = ["env", "--num-envs", "4", "--latency-ms", "5", "--steps", "2", "--repeats", "2"]
    assert main([*argv, "--sequential-calls", "4", "--json"]) == 0
    report = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert set(report) >= KEYS
    assert report["tool_errors"] == 0
    assert len(report["env_walls_s"]) == len(report["sdk_floor_walls_s"]) == 2
    assert report["settings"]["num_envs"] == 4 and report["sequential_calls_measured"] == 4


def test_unknown_command_and_help(capfd):
    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capfd.readouterr().err
    assert main(["--help"]) == 0
    assert main([]) == 2
