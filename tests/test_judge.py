"""JudgeReward over real HTTP: a scripted OpenAI-compatible aiohttp server and rlf-serve with a tiny model.

The scripted server (:class:`tests.helpers.OpenAITestServer`, fixture ``openai_server``) and
:func:`tests.helpers.rlf_serve` (``python -m rlf_serve.app`` as a subprocess) are shared with the
agent-tool and serve tests.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import gymnasium as gym
import pytest

import rlf_envs  # noqa: F401
from rlf_envs.llm_client import ChatErrorKind, chat_completions_url
from rlf_envs.rewards.judge import (
    NO_REFERENCE,
    JudgeReward,
    parse_score_tag,
    parse_yes_no,
    render_prompt,
)
from rlf_envs.types import Episode, TaskInstance
from tests.helpers import OpenAITestServer, free_local_port, rlf_serve


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.json()


def episode(question: str, answer: str | None, gold: Any, *, terminated: bool = True) -> Episode:
    final = "" if answer is None else f"<answer>{answer}</answer>"
    return Episode(
        instance=TaskInstance(id=question, question=question, answer=gold),
        messages=[],
        final_response=final,
        final_answer=answer,
        tool_calls=[],
        turns=1,
        terminated=terminated,
        truncated=not terminated,
    )


async def judge_all(judge: JudgeReward, episodes: list[Episode]) -> list[dict[str, Any]]:
    try:
        return list(await asyncio.gather(*(judge(ep) for ep in episodes)))
    finally:
        await judge.aclose()


# ------------------------------------------------------------------------------------------------
# Parsing and prompts, in isolation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<score>1</score>", 1.0),
        ("<score>0</score>", 0.0),
        ("reasoning... <SCORE> 0.5 </SCORE>", 0.5),
        ("<score>0</score> on second thought <score>1.0</score>", 1.0),
        ("<think>maybe <score>0</score></think>The answer is right. <score>1</score>", 1.0),
        ("<think>unfinished thought <score>1</score>", None),
        ("<score>1.5</score>", None),
        ("<score>-0.1</score>", None),
        ("<score>nan</score>", None),
        ("<score>high</score>", None),
        ("score: 1", None),
        ("", None),
    ],
)
def test_score_tag_parser(text: str, score: float | None) -> None:
    assert parse_score_tag(text) == score


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("yes", 1.0),
        ("No.", 0.0),
        ("  **Yes** - the alias matches", 1.0),
        ("No, although yes was tempting", 0.0),
        ("The dates differ. Final verdict: no", 0.0),
        ("Both name the same river, so yes.", 1.0),
        ("<think>no wait</think>Yes", 1.0),
        ("eyes nose", None),
        ("maybe", None),
    ],
)
def test_yes_no_parser(text: str, score: float | None) -> None:
    assert parse_yes_no(text) == score


def test_prompt_rendering_and_template_validation() -> None:
    prompt = render_prompt(JudgeReward("http://x/v1", "m").prompt_template, question="Who {founded} it?",
                           answer="Movo", golds=["Movo Rebon", "Rebon"])  # fmt: skip
    assert (
        "Question: Who {founded} it?\nReference answer(s): Movo Rebon | Rebon\nCandidate answer: Movo\n"
        in prompt
    )
    assert "<score>" in prompt
    assert "Reference answer(s): " + NO_REFERENCE in render_prompt("Reference answer(s): {gold}", question="q", answer="a", golds=[])  # fmt: skip
    assert "yes or no" in JudgeReward("http://x/v1", "m", score_parser="yes_no").prompt_template
    with pytest.raises(ValueError, match="question.*gold.*answer"):
        JudgeReward("http://x/v1", "m", prompt_template="{question} {reference}")
    with pytest.raises(ValueError, match="unknown score_parser"):
        JudgeReward("http://x/v1", "m", score_parser="stars")
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/api/chat/completions") == "http://h:1/api/chat/completions"


# ------------------------------------------------------------------------------------------------
# Against the scripted server
# ------------------------------------------------------------------------------------------------


def test_scores_right_and_wrong_answers(openai_server: OpenAITestServer) -> None:
    judge = JudgeReward(openai_server.url, "judge-1", max_tokens=16)
    episodes = [
        episode("Who founded Pilatra Works?", "movo rebon", ["Movo Rebon", "Rebon"]),
        episode("Who founded Pilatra Works?", "Tarin Vosk", ["Movo Rebon"]),
        episode("Capital of Zorvia?", None, "Leidax", terminated=False),  # no answer: not sent
    ]
    right, wrong, missing = asyncio.run(judge_all(judge, episodes))
    assert right == {"reward": 1.0, "judge_score": 1.0, "judge_raw": "<score>1</score>", "judge_fallback": False,
                     "judge_error": None, "judge_error_kind": None}  # fmt: skip
    assert (wrong["reward"], wrong["judge_score"], wrong["judge_fallback"]) == (0.0, 0.0, False)
    assert (missing["reward"], missing["judge_fallback"]) == (0.0, False)
    assert openai_server.requests == 2
    body = openai_server.bodies[0]
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("judge-1", 16, 0.0)
    assert "Candidate answer: movo rebon" in body["messages"][-1]["content"]


def test_yes_no_judge_and_a_plain_text_final_answer(openai_server: OpenAITestServer) -> None:
    judge = JudgeReward(openai_server.url, "judge-1", score_parser="yes_no", system_prompt="You are strict.")
    plain = episode("Capital of Zorvia?", None, ["Leidax"])
    plain.final_response = "Leidax"  # answered without <answer> tags: the response is the answer
    results = asyncio.run(judge_all(judge, [plain, episode("Capital of Zorvia?", "Trutem", ["Leidax"])]))
    assert [(r["reward"], r["judge_raw"]) for r in results] == [(1.0, "yes"), (0.0, "no")]
    assert openai_server.bodies[0]["messages"][0] == {"role": "system", "content": "You are strict."}


def test_32_episodes_with_max_concurrency_16_keep_16_in_flight(openai_server: OpenAITestServer) -> None:
    openai_server.delay_s = 0.3
    judge = JudgeReward(openai_server.url, "judge-1", max_concurrency=16)
    results = asyncio.run(judge_all(judge, [episode(f"q{i}", "a", "a") for i in range(32)]))
    assert [r["reward"] for r in results] == [1.0] * 32
    assert openai_server.requests == 32
    assert openai_server.peak_in_flight == 16


def test_transient_500s_are_retried(openai_server: OpenAITestServer) -> None:
    openai_server.fail_first = 2
    judge = JudgeReward(openai_server.url, "judge-1", retries=2, backoff_s=0.01)
    [result] = asyncio.run(judge_all(judge, [episode("q", "a", "a")]))
    assert (result["reward"], result["judge_fallback"]) == (1.0, False)
    assert openai_server.requests == 3
    assert judge.client.stats.retries == 2


@pytest.mark.parametrize(
    ("model", "timeout_s", "kind", "requests", "message"),
    [
        ("fail-503", 5.0, ChatErrorKind.UNAVAILABLE, 3, "HTTP 503"),
        ("fail-429", 5.0, ChatErrorKind.UNAVAILABLE, 3, "HTTP 429"),
        ("hang", 0.3, ChatErrorKind.UNAVAILABLE, 3, "no reply within 0.3 s"),
        ("fail-400", 5.0, ChatErrorKind.BAD_RESPONSE, 1, "HTTP 400"),  # not worth retrying
        ("garbage", 5.0, ChatErrorKind.BAD_RESPONSE, 1, "not a chat completion"),
        ("empty", 5.0, ChatErrorKind.UNPARSABLE, 1, "no score"),
    ],
)
def test_failures_become_flagged_fallbacks(
    openai_server: OpenAITestServer,
    model: str,
    timeout_s: float,
    kind: ChatErrorKind,
    requests: int,
    message: str,
) -> None:
    judge = JudgeReward(
        openai_server.url, model, retries=2, backoff_s=0.01, timeout_s=timeout_s, fallback_score=0.25
    )
    [result] = asyncio.run(judge_all(judge, [episode("q", "a", "a")]))
    assert (result["reward"], result["judge_score"], result["judge_fallback"]) == (0.25, None, True)
    assert result["judge_error_kind"] == kind.value
    assert result["judge_error"].startswith(kind.value) and message in result["judge_error"]
    assert openai_server.requests == requests


def test_unparsable_reply_and_a_raising_parser_fall_back(openai_server: OpenAITestServer) -> None:
    openai_server.reply = "I would say it is mostly fine."
    judges = [
        JudgeReward(openai_server.url, "judge-1", fallback_score=-1.0),
        JudgeReward(openai_server.url, "judge-1", fallback_score=-1.0, score_parser=lambda text: 1 / 0),
        JudgeReward(openai_server.url, "judge-1", score_parser=lambda text: 0.5 if "fine" in text else None),
    ]
    tag, raising, custom = (asyncio.run(judge_all(j, [episode("q", "a", "a")]))[0] for j in judges)
    assert (tag["reward"], tag["judge_fallback"], tag["judge_raw"]) == (-1.0, True, openai_server.reply)
    assert tag["judge_error_kind"] == "unparsable"
    assert raising["judge_fallback"] and "ZeroDivisionError" in raising["judge_error"]
    assert (custom["reward"], custom["judge_fallback"]) == (0.5, False)


def test_unreachable_judge_falls_back_without_raising() -> None:
    judge = JudgeReward(
        f"http://127.0.0.1:{free_local_port()}/v1", "judge-1", retries=1, backoff_s=0.01, fallback_score=0.5
    )
    results = asyncio.run(judge_all(judge, [episode(f"q{i}", "a", "a") for i in range(4)]))
    assert all(
        r["judge_fallback"] and r["reward"] == 0.5 and r["judge_error_kind"] == "unavailable" for r in results
    )
    assert judge.client.stats.attempts == 8 and judge.client.stats.failures == 4


def test_one_session_per_event_loop_closed_with_its_loop(openai_server: OpenAITestServer) -> None:
    from rlf_envs.loop_thread import LoopThread as EnvLoopThread  # closes like the envs' loops do

    judge = JudgeReward(openai_server.url, "judge-1")
    loops = [EnvLoopThread(), EnvLoopThread()]
    try:
        for loop in loops:
            assert loop.run(judge(episode("q", "a", "a")))["reward"] == 1.0
        assert judge.client.open_sessions == 2
        judge.close()  # closes the sessions on both (running) loops from this thread
        assert judge.client.open_sessions == 0
        assert loops[0].run(judge(episode("q", "a", "a")))["reward"] == 1.0  # a fresh session
        assert judge.client.open_sessions == 1
    finally:
        for loop in loops:
            loop.close()

    async def use_without_aclose() -> int:
        await judge(episode("q", "a", "a"))
        return judge.client.open_sessions

    # asyncio.run shuts down async generators before closing the loop; that closes the session
    assert asyncio.run(use_without_aclose()) == 1
    assert judge.client.open_sessions == 0


def test_vector_env_scores_32_episodes_in_one_step(openai_server: OpenAITestServer) -> None:
    openai_server.delay_s = 0.2
    judge = JudgeReward(openai_server.url, "judge-1", max_concurrency=16)
    tasks = [{"question": f"What is the code word {i}?", "answer": f"word{i}"} for i in range(32)]
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=32, tasks=tasks, reward=judge, autoreset_mode="Disabled")
    try:
        envs.reset(seed=0, options={"task_indices": list(range(32))})
        actions = [
            f"<answer>word{i}</answer>" if i % 2 == 0 else "<answer>no idea</answer>" for i in range(32)
        ]
        _, rewards, terminated, _, infos = envs.step(actions)
    finally:
        envs.close()
    assert terminated.all()
    assert rewards.tolist() == [1.0 if i % 2 == 0 else 0.0 for i in range(32)]
    assert not infos["reward_info"]["judge_fallback"].any()  # vector infos: one array per key
    assert openai_server.requests == 32 and openai_server.peak_in_flight == 16
    assert judge.client.open_sessions == 0  # closed with the env's loop


def test_deepsearch_judge_mode(openai_server: OpenAITestServer) -> None:

    env = gym.make(
        "RLF/DeepSearch-v0", reward="judge", judge_url=openai_server.url, judge_model="judge-1", split="test"
    )
    try:
        env.reset(seed=0, options={"task_index": 0})
        gold = env.unwrapped.task.instances("test")[0].answer
        right = gold if isinstance(gold, str) else list(gold)[-1]  # an alias is right too
        _, reward, terminated, _, info = env.step(f"<answer>{right}</answer>")
        assert terminated and reward == 1.0 and info["reward_info"]["judge_score"] == 1.0
        assert "em" in info["reward_info"]  # the rule scores stay alongside
        env.reset(seed=0, options={"task_index": 0})
        _, reward, *_ = env.step("<answer>Nobody Knows</answer>")
        assert reward == 0.0
    finally:
        env.close()
    assert openai_server.requests == 2


# ------------------------------------------------------------------------------------------------
# Against rlf-serve with the tiny random Qwen3 (its replies are noise: the parsing must still hold)
# ------------------------------------------------------------------------------------------------


def test_16_judge_calls_on_rlf_serve_are_batched_and_parsed(shared_tiny_model_dir: Path) -> None:
    with rlf_serve(shared_tiny_model_dir, "--batch-wait-ms", "2000", "--max-batch", "16") as (url, _):
        judge = JudgeReward(url, "tiny", max_tokens=8, max_concurrency=16)
        results = asyncio.run(
            judge_all(judge, [episode(f"Question {i}?", f"answer {i}", "gold") for i in range(16)])
        )
        stats = asyncio.run(get_json(url.removesuffix("/v1") + "/stats"))
    for result in results:
        assert result["judge_error_kind"] in (None, "unparsable")  # a reply came back every time
        assert result["judge_score"] == parse_score_tag(result["judge_raw"])
        assert result["judge_fallback"] == (result["judge_score"] is None)
    assert stats["requests"] == 16 and stats["peak_in_flight"] == 16
    assert stats["largest_batch"] > 1 and stats["batches"] < 16


def test_rlf_serve_stopped_mid_batch_gives_flagged_fallbacks(shared_tiny_model_dir: Path) -> None:
    with rlf_serve(shared_tiny_model_dir, "--batch-wait-ms", "1000", "--max-batch", "16") as (url, process):
        judge = JudgeReward(url, "tiny", max_tokens=3000, temperature=1.0, retries=1, backoff_s=0.05,
                            timeout_s=120, fallback_score=0.25)  # fmt: skip

        async def kill_when_the_batch_generates() -> dict[str, Any]:
            while True:
                stats = await get_json(url.removesuffix("/v1") + "/stats")
                if stats["active_batch"] == 16:
                    process.send_signal(signal.SIGKILL)
                    return stats
                await asyncio.sleep(0.02)

        async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
            killer = asyncio.create_task(kill_when_the_batch_generates())
            results = await judge_all(judge, [episode(f"q{i}", "a", "a") for i in range(16)])
            return results, await killer

        results, stats_at_kill = asyncio.run(scenario())
    assert stats_at_kill["requests"] == 0 and stats_at_kill["in_flight"] == 16
    for result in results:
        assert (result["reward"], result["judge_fallback"], result["judge_error_kind"]) == (
            0.25,
            True,
            "unavailable",
        )
    assert judge.client.stats.attempts == 32  # every call retried once, against a dead port


def test_judge_info_is_json_serialisable(openai_server: OpenAITestServer) -> None:
    [result] = asyncio.run(
        judge_all(JudgeReward(openai_server.url, "fail-500", retries=0), [episode("q", "a", "a")])
    )
    assert json.loads(json.dumps(result)) == result
