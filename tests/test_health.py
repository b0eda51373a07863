"""rlf_trainer.observe.health: every check trips on the metric stream of its pathology, and only then.

The streams are what :func:`rlf_trainer.observe.metrics.rollout_metrics` and the GRPO step log; the
documented codebook runs (docs/learning_runs) must trip nothing. Runs of the real trainer on the
tiny model (a greedy policy, a format-only reward, a healthy policy) are in
tests/test_health_runs.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlf_trainer.config import ConfigError, load_config
from rlf_trainer.config_sections import HealthConfig
from rlf_trainer.observe.health import CHECK_NAMES, HINTS, HealthCheckFailed, HealthLog, HealthMonitor
from rlf_trainer.observe.metrics import rollout_metrics
from rlf_trainer.rollout.trajectory import EpisodeStats
from tests.helpers import REPO


def run(stream: list[dict[str, float]], **config: object) -> list[tuple[int, str]]:
    """(step, check) of every trip, steps numbered from 1."""
    monitor = HealthMonitor(HealthConfig(**config), max_total_tokens=1024, tool_schema_tokens=2905)
    return [
        (step, trip.check)
        for step, metrics in enumerate(stream, 1)
        for trip in monitor.update(step, metrics).trips
    ]


def first_trips(stream: list[dict[str, float]], **config: object) -> dict[str, int]:
    out: dict[str, int] = {}
    for step, check in run(stream, **config):
        out.setdefault(check, step)
    return out


HEALTHY = {"reward/mean": 0.4, "reward/max": 1.0, "reward/min": 0.0, "groups/zero_variance": 0.2,
           "entropy": 0.8, "response_length": 60.0, "truncated_turns": 0.0, "tool_calls_per_episode": 1.0,
           "silent_at_budget": 0.0, "finish/answer": 1.0}  # fmt: skip


def stream(n: int, **changes: float) -> list[dict[str, float]]:
    return [HEALTHY | changes for _ in range(n)]


# Each pathology as a metric stream, and the step its check must trip at (patience 3, baseline 3).
PATHOLOGIES: dict[str, tuple[list[dict[str, float]], int]] = {
    "over_budget": (stream(2, **{"silent_at_budget": 1.0, "finish/max_total_tokens": 1.0, "prompt_length/max": 3030}), 1),
    "history_over_budget": (stream(1, **{"finish/max_total_tokens": 0.6, "finish/answer": 0.4}), 1),
    "no_learning_signal": (stream(4, **{"groups/zero_variance": 1.0, "reward/min": 0.0, "reward/max": 0.0, "reward/mean": 0.0}), 3),
    "entropy_collapse": (stream(4, entropy=0.005), 3),
    "entropy_blowup": (stream(3) + stream(4, entropy=2.5), 6),
    "length_collapse": (stream(3) + stream(4, response_length=4.0), 6),
    "length_runaway": (stream(3) + stream(4, response_length=300.0), 6),
    "turn_truncation": (stream(4, truncated_turns=0.9), 3),
    "turn_limit": (stream(4, **{"finish/max_turns": 0.4, "finish/answer": 0.6}), 3),
    "tool_call_errors": (stream(3, **{"tool_errors/bad_json": 0.05}) + stream(4, **{"tool_errors/bad_json": 0.4, "tool_errors/unknown_tool": 0.2}), 6),
    "repeated_tool_calls": (stream(4, repeated_tool_calls=0.5), 3),
    "reward_vs_goal": (
        [HEALTHY | {"reward/mean": 0.1 * s} | ({"eval/accuracy": 0.3 - 0.01 * s} if s % 3 == 0 else {}) for s in range(1, 10)],
        9,
    ),
    "reward_off_goal": (stream(4, **{"reward/off_goal_share": 1.0, "reward_info/format": 1.0, "reward_info/em": 0.0}), 3),
    "sampler_mismatch": (stream(1, sampler_kl=0.4), 1),
    "sim_errors": (stream(1, sim_error_rate=0.5), 1),
}  # fmt: skip


def test_every_check_has_a_pathology_and_a_hint_naming_a_config_key():
    assert set(PATHOLOGIES) == set(CHECK_NAMES)
    keys = ("rollout.", "algorithm.", "optim.", "env.", "health.")
    assert all(any(key in HINTS[name] for key in keys) for name in CHECK_NAMES)


@pytest.mark.parametrize("check", list(PATHOLOGIES))
def test_each_check_trips_on_its_pathology_and_no_other_does(check):
    metrics, step = PATHOLOGIES[check]
    assert first_trips(metrics) == {check: step}
    assert first_trips(stream(len(metrics))) == {}  # the same length of healthy steps trips nothing


def test_over_budget_message_gives_the_numbers():
    monitor = HealthMonitor(HealthConfig(), max_total_tokens=1024, tool_schema_tokens=2905)
    metrics, _ = PATHOLOGIES["over_budget"]
    trip = monitor.update(1, metrics[0]).trips[0]
    assert trip.message == (
        "100% of episodes hit rollout.max_total_tokens=1024 before the model said anything: the prompt "
        "takes up to 3030 tokens (2905 of them the tool schemas)"
    )
    assert "rollout.max_total_tokens" in trip.hint


def test_zero_variance_of_a_solved_task_is_not_a_missing_signal():
    """Every episode at the best reward the run has seen, after improving to it: saturated, not stuck."""
    climbing = [HEALTHY | {"reward/mean": 0.3, "reward/min": 0.0, "reward/max": 1.0}]
    solved = stream(
        4, **{"groups/zero_variance": 1.0, "reward/mean": 1.0, "reward/min": 1.0, "reward/max": 1.0}
    )
    assert first_trips(climbing + solved) == {}


def test_falling_tool_errors_and_a_flat_goal_without_a_rising_reward_trip_nothing():
    errors = [HEALTHY | {"tool_errors/bad_json": 0.6 - 0.1 * s} for s in range(6)]
    flat = [HEALTHY | ({"eval/accuracy": 0.3} if s % 2 == 0 else {}) for s in range(8)]
    assert first_trips(errors) == {} and first_trips(flat) == {}


def test_goal_metric_can_be_a_training_reward_component():
    hacked = [HEALTHY | {"reward/mean": 0.1 * s, "reward_info/em": 0.2} for s in range(1, 8)]
    assert first_trips(hacked, goal_metric="reward_info/em") == {"reward_vs_goal": 3}
    assert first_trips(hacked) == {}  # no eval metric in the stream: nothing to compare with


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_documented_codebook_runs_trip_nothing(seed):
    path = REPO / "docs" / "learning_runs" / f"seed{seed}_metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 20 and first_trips(records) == {}


def test_flags_are_logged_for_every_check_every_step_and_disabled_means_all_zero():
    monitor = HealthMonitor(HealthConfig())
    flags = monitor.update(1, PATHOLOGIES["sampler_mismatch"][0][0]).flags
    assert (
        set(flags) == {f"health/{name}" for name in CHECK_NAMES} and flags["health/sampler_mismatch"] == 1.0
    )
    quiet = HealthMonitor(HealthConfig(enabled=False)).update(1, PATHOLOGIES["sampler_mismatch"][0][0])
    assert set(quiet.flags.values()) == {0.0} and quiet.trips == []


def test_health_log_writes_each_new_trip_warns_once_and_fails_on_request(tmp_path: Path):
    lines: list[str] = []
    log = HealthLog(tmp_path, ["entropy_collapse"], echo=lines.append)
    monitor = HealthMonitor(HealthConfig(patience=1))
    kl = PATHOLOGIES["sampler_mismatch"][0][0]
    for step, metrics in enumerate([kl, kl, HEALTHY, kl], 1):  # trips, holds, recovers, trips again
        report = monitor.update(step, metrics)
        log.write(report)
        log.raise_on_failure(report)
    records = [json.loads(line) for line in (tmp_path / "health.jsonl").read_text().splitlines()]
    assert [(r["step"], r["check"]) for r in records] == [(1, "sampler_mismatch"), (4, "sampler_mismatch")]
    assert set(records[0]) == {"step", "check", "message", "hint"}
    assert records[0]["message"] == "sampler_kl 0.4 > health.sampler_kl_max=0.05"
    assert lines == [
        f"health warning [step 1] sampler_mismatch: {records[0]['message']}. Try: {HINTS['sampler_mismatch']}"
    ]
    with pytest.raises(HealthCheckFailed) as failed:
        report = monitor.update(5, HEALTHY | {"entropy": 0.001})
        log.write(report)
        log.raise_on_failure(report)
    assert str(failed.value) == (
        "health check 'entropy_collapse' failed at step 5 (it is in health.fail_on): token entropy 0.001 < "
        f"health.entropy_min=0.02 for 1 steps: the policy has stopped exploring. Try: {HINTS['entropy_collapse']}"
    )


def test_health_config_names_the_checks():
    assert load_config(None, ["model.path=m", "health.fail_on=[no_learning_signal]"]).health.fail_on == [
        "no_learning_signal"
    ]
    with pytest.raises(
        ConfigError,
        match=r"health.fail_on\[0\] must be one of .*got 'no_signal' \(did you mean 'no_learning_signal'\?\)",
    ):
        load_config(None, ["model.path=m", "health.fail_on=[no_signal]"])


def test_episode_stats_become_the_metrics_the_checks_read():
    silent = EpisodeStats(
        "0", 0, prompt_length=1100, finish_reason="max_total_tokens", turn_finish_reasons=["length"]
    )
    looping = EpisodeStats("1", 0, prompt_length=300, response_length=40, finish_reason="max_turns", tool_calls=3,
                           tool_errors=1, error_kinds=["bad_json"], tool_call_keys=["a", "a", "b"],
                           turn_finish_reasons=["stop", "stop", "length"], reward=0.2, correct=False,
                           reward_info={"reward": 0.2, "format": 1.0, "em": 0.0, "judge": "no"})  # fmt: skip
    metrics = rollout_metrics([silent, looping])
    assert metrics["silent_at_budget"] == 0.5 and metrics["prompt_length/max"] == 1100
    assert metrics["truncated_turns"] == 0.5
    assert metrics["tool_errors/bad_json"] == pytest.approx(1 / 3) and metrics[
        "repeated_tool_calls"
    ] == pytest.approx(1 / 3)
    assert metrics["reward_info/format"] == 1.0 and "reward_info/judge" not in metrics
    assert metrics["reward/off_goal_share"] == 1.0
