"""``rlf-bench``: the dispatcher and ``env``'s --json contract, on a real latency server."""

import json

import pytest

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


def test_profile_splits_the_generation_and_update_wall_times_into_their_categories(capfd, tiny_model_dir):
    """``rlf-bench profile --update`` on the tiny config: each phase's categories add up to its wall time."""
    import sys

    from rlf_bench.rollout_profile import CATEGORIES
    from tests.helpers import TINY_CONFIG

    overrides = [f"model.path={tiny_model_dir}", "model.prepare=null",
                 f"env.kwargs.mcp_servers.mcpServers.latency.command={sys.executable}"]  # fmt: skip
    argv = ["profile", "--config", str(TINY_CONFIG), "--steps", "2", "--precision", "no", "--update"]
    assert main([*argv, "--json", *overrides]) == 0
    out = capfd.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    for wall, split in (("generation_s_per_step", "seconds_per_step"),
                        ("update_s_per_step", "update_seconds_per_step")):  # fmt: skip
        seconds = report[split]
        assert list(seconds) == list(CATEGORIES)
        assert sum(seconds.values()) == pytest.approx(report[wall], rel=1e-6)
        assert seconds["body matmuls"] > 0 and seconds["vocabulary projection"] > 0
    assert "profiler_s_per_step" in report and "s a step left out" in out[1]  # the profiler's own work
    assert report["forwards_per_step"] >= 1 and report["generated_tokens_per_forward"] > 0
    assert (
        report["profiled_steps"] == 1 and report["precision"] == "no" and report["update_tokens_per_step"] > 0
    )
    assert any(line.startswith("vocabulary projection") for line in out) and "update time" in "\n".join(out)
    with pytest.raises(SystemExit):  # the first step is a warm-up: one step profiles nothing
        main(["profile", "--config", str(TINY_CONFIG), "--steps", "1"])
    assert "--steps must be >= 2" in capfd.readouterr().err
