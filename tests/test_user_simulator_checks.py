"""The simulator checks against the labelled set, the judge model over real HTTP, and how flags end episodes.

The labelled set is ``rlf_envs/dialogue/data/sim_replies.jsonl`` (``dev``: what the rules were
written against; ``heldout``: written after, never tuned on). The judge is the scripted
OpenAI-compatible server of ``tests/helpers.py`` on 127.0.0.1, answering through its
``responder``; its ``hang`` and ``fail-<status>`` models script the judge's failures.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import threading

import gymnasium as gym
import pytest

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_bench.sim_checks_bench import load_replies, main, rules_flag
from rlf_envs.core.env_runtime import build_user_simulator
from rlf_envs.core.task import FunctionTask
from rlf_envs.dialogue import DEFAULT_STOP_MARKER, LLMUserSimulator, UserTurnRequest
from rlf_envs.dialogue.runner import DEFAULT_SIM_TIMEOUT_S

INSTRUCTIONS = "You are Ann Holt. Your email is ann@example.com. You want to cancel your order #W1001."
TASKS = [{"id": f"u{i}", "question": f"Hi, I need help number {i}.", "answer": str(i),
          "user_instructions": INSTRUCTIONS} for i in range(8)]  # fmt: skip
ROWS = load_replies()
CATEGORIES = sorted({r.category for r in ROWS if r.label == "bad"})


def make_vec(num_envs, simulator, **kwargs):
    return gym.make_vec(
        "RLF/ToolUse-v0", num_envs=num_envs, tasks=TASKS, reward="exact_match", user_simulator=simulator,
        max_turns=6, autoreset_mode="Disabled", **kwargs,
    )  # fmt: skip


# ------------------------------------------------------------------------------ the labelled set


def test_the_set_is_big_enough_and_split():
    counts = collections.Counter((r.split, r.label) for r in ROWS)
    assert counts["dev", "bad"] + counts["heldout", "bad"] >= 150
    assert counts["dev", "good"] + counts["heldout", "good"] >= 150
    assert counts["heldout", "bad"] >= 50 and counts["heldout", "good"] >= 50
    assert len(CATEGORIES) == 8 and len({r.reply for r in ROWS}) == len(ROWS)


@pytest.mark.parametrize("category", CATEGORIES)
def test_each_category_is_caught_with_its_kind(category):
    rows = [r for r in ROWS if r.category == category and r.label == "bad"]
    flags = [rules_flag(r) for r in rows]
    dev = [(r, f) for r, f in zip(rows, flags, strict=True) if r.split == "dev"]
    assert all(f is not None and f.kind == r.kind for r, f in dev), [
        (r.reply, f) for r, f in dev if f is None or f.kind != r.kind
    ]
    caught = sum(f is not None for f in flags)
    assert caught / len(rows) >= 0.85, (category, caught, len(rows))


def test_recall_and_false_alarm_rate_on_the_whole_set():
    flags = {r.id: rules_flag(r) for r in ROWS}
    bad = [r for r in ROWS if r.label == "bad"]
    good = [r for r in ROWS if r.label == "good"]
    recall = sum(flags[r.id] is not None for r in bad) / len(bad)
    false_alarms = [(r.reply, flags[r.id]) for r in good if flags[r.id] is not None]
    assert recall >= 0.9
    assert len(false_alarms) / len(good) <= 0.01, false_alarms
    assert recall < 1.0  # the held-out part has misses: the rules were not fitted to it


def test_bench_prints_rules_only_table(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "| dev | agent_voice | 24 | 1.00 | 1.00 | - | - |" in out
    assert re.search(r"\| all \| \*\*all bad\*\* \| 247 \| 1\.00 \| 0\.9\d \| - \| - \|", out), out


# ------------------------------------------------------------------------------ the judge


def _judge_line(body) -> str:
    return re.search(r"The customer's line: (.*)\n\nAnswer", body["messages"][-1]["content"], re.S).group(1)


def test_bench_with_a_scripted_judge_adds_its_flags(openai_server, capsys):
    openai_server.responder = lambda body: "OUT" if "?" in _judge_line(body) else "IN"
    assert main(["--split", "dev", "--judge-url", openai_server.url, "--judge-model", "judge", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["dev"]
    dev = [r for r in ROWS if r.split == "dev"]
    passed = [r for r in dev if rules_flag(r) is None and r.reply.strip() != DEFAULT_STOP_MARKER]
    assert openai_server.requests == len(passed) and openai_server.peak_in_flight > 1
    good = [r for r in dev if r.label == "good"]
    expected_fp = sum(1 for r in good if rules_flag(r) is not None or "?" in r.reply)
    assert summary["rules+judge"]["good"]["flagged"] == expected_fp > summary["rules"]["good"]["flagged"]
    assert (
        summary["rules+judge"]["all_bad"]["recall"] == 1.0 and summary["rules+judge"]["judge_failures"] == 0
    )


def _polite(request: UserTurnRequest) -> str:
    return f"Do you need my email for order {request.instance.id}?" if request.turn == 0 else "ok"


def test_judge_flags_out_of_character_turns_all_at_once(openai_server):
    openai_server.delay_s = 0.2
    openai_server.responder = lambda body: (
        "OUT" if "u3" in _judge_line(body) or "u5" in _judge_line(body) else "IN"
    )
    checks = {"judge": {"base_url": openai_server.url, "model": "judge", "timeout_s": 20.0}}
    envs = make_vec(8, _polite, sim_checks=checks)
    try:
        envs.reset(options={"task_indices": list(range(8))})
        obs, _, terminated, truncated, infos = envs.step(["Which number?"] * 8)
        assert openai_server.requests == 8 and openai_server.peak_in_flight == 8
        assert truncated.tolist() == [i in (3, 5) for i in range(8)] and not terminated.any()
        assert list(infos["sim_error"][infos["_sim_error"]]) == ["out_of_character"] * 2
        assert obs[0] == "Do you need my email for order u0?"
        judged = openai_server.bodies[0]["messages"][0]["content"]
        assert "Which number?" in judged and INSTRUCTIONS in judged
    finally:
        envs.close()


def test_the_judge_sees_a_stop_without_its_marker_and_never_a_bare_marker(openai_server):
    from rlf_envs.dialogue import SimChecks, SimulatorRunner, resolve_user_simulator
    from rlf_envs.types import TaskInstance

    checks = SimChecks(judge={"base_url": openai_server.url, "model": "judge"})
    for reply, requests in [(f"Thanks, bye! {DEFAULT_STOP_MARKER}", 1), (DEFAULT_STOP_MARKER, 0)]:
        openai_server.reset()
        openai_server.responder = lambda body: "IN"
        runner = SimulatorRunner(resolve_user_simulator(lambda r, reply=reply: reply), checks)
        request = UserTurnRequest(TaskInstance("0", "Hi"), INSTRUCTIONS, [], turn=2)
        turn = asyncio.run(runner.next_turn(request))
        assert turn.stop and turn.flag is None and openai_server.requests == requests
        assert all(DEFAULT_STOP_MARKER not in json.dumps(b) for b in openai_server.bodies)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("model", "responder", "kind"),
    [
        ("fail-500", None, "judge_error"),
        ("judge", lambda body: "maybe", "judge_error"),
        ("hang", None, "judge_timeout"),
    ],  # fmt: skip
)
def test_judge_failures_flag_the_turn_as_their_own_kind(openai_server, model, responder, kind):
    openai_server.responder = responder
    checks = {"judge": {"base_url": openai_server.url, "model": model, "timeout_s": 0.5, "retries": 0}}
    envs = make_vec(2, _polite, sim_checks=checks)
    try:
        envs.reset(options={"task_indices": [0, 1]})
        _, _, terminated, truncated, infos = envs.step(["Which number?", "<answer>1</answer>"])
        assert truncated.tolist() == [True, False] and terminated.tolist() == [False, True]
        assert infos["sim_error"][0] == kind, infos["sim_error_message"][0]
    finally:
        envs.close()


# ------------------------------------------------------------------------------ how flags end episodes


def test_a_stop_marker_inside_leaked_instructions_is_a_leak_not_a_stop():
    leak = f"When your request is done, write a last short message that ends with {DEFAULT_STOP_MARKER}"
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, reward="exact_match", user_simulator=lambda r: leak)
    try:
        env.reset(options={"task_index": 0})
        _, _, terminated, truncated, info = env.step("Anything else?")
        assert (terminated, truncated) == (False, True) and "user_stop" not in info
        assert info["sim_error"] == "revealed_goal"
    finally:
        env.close()


def test_flagged_episodes_finish_as_sim_error():
    from rlf_trainer.rollout.trajectory import (
        FINISH_MAX_TURNS,
        FINISH_SIM_ERROR,
        EpisodeStats,
        Trajectory,
        finish_trajectory,
    )

    def finished(info, terminated):
        traj = Trajectory([], [], [], EpisodeStats(None, 0), [], [])
        finish_trajectory(traj, 0.0, info, terminated=terminated)
        return traj.stats.finish_reason

    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, reward="exact_match", user_simulator=lambda r: "User: hi")
    try:
        env.reset(options={"task_index": 0})
        *_, truncated, info = env.step("Hello?")
        assert truncated and info["sim_error"] == "role_labels"
        assert finished(info, terminated=False) == FINISH_SIM_ERROR == "sim_error"
        assert finished({}, terminated=False) == FINISH_MAX_TURNS
    finally:
        env.close()


@pytest.mark.timeout(60)
def test_an_http_client_timeout_is_kind_timeout(openai_server):
    simulator = {"base_url": openai_server.url, "model": "hang", "retries": 0, "timeout_s": 0.3}
    envs = make_vec(1, simulator, sim_timeout_s=20.0)  # the client's limit fires first
    try:
        envs.reset(options={"task_indices": [0]})
        *_, infos = envs.step(["Which number?"])
        assert infos["sim_error"][0] == "timeout", infos["sim_error_message"][0]
    finally:
        envs.close()


def test_default_time_limits_fit_together():
    runner = build_user_simulator(FunctionTask("t", [], lambda ep: 0.0), {"base_url": "http://h:1/v1"})
    client = runner.simulator.client
    assert runner.timeout_s == DEFAULT_SIM_TIMEOUT_S <= 60.0  # one hung simulator holds a sync step that long
    assert client.timeout_s * (client.retries + 1) + client.backoff_s < runner.timeout_s
    assert isinstance(runner.simulator, LLMUserSimulator)


@pytest.mark.timeout(60)
def test_async_step_of_one_env_does_not_wait_for_a_hung_simulator():
    entered, release = threading.Event(), threading.Event()

    async def simulator(request: UserTurnRequest) -> str:
        if request.instance.id == "u0":
            entered.set()
            while not release.is_set():
                await asyncio.sleep(0.01)
            return "late"
        return "quick"

    envs = make_vec(2, simulator)

    async def run():
        envs.reset(options={"task_indices": [0, 1]})
        slow = asyncio.ensure_future(envs.astep_one(0, "Hello?"))
        await asyncio.to_thread(entered.wait, 30)
        quick = await envs.astep_one(1, "Hello?")
        pending = not slow.done()
        release.set()
        return quick, pending, await slow

    try:
        quick, pending, slow = asyncio.run(run())
        assert quick[0] == "quick" and pending and slow[0] == "late"
    finally:
        release.set()
        envs.close()
