"""The codebook task (RLF/Codebook-v0, i.e. RLF/ToolUse-v0 with its kwargs): deterministic data, the lookup tool, the shaped reward."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from gymnasium.utils.env_checker import check_env

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_envs.tasks.codebook import (
    CODEBOOK,
    EXAMPLE_CODE,
    EXAMPLE_WORD,
    SYSTEM_PROMPT,
    TEST_TASKS,
    TOOL_NAME,
    TRAIN_TASKS,
    WORDS,
    make_codebook,
    make_task_records,
    tool_use_kwargs,
)

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "configs" / "smollm2_learn_cpu.yaml"


def call(word: str) -> str:
    return f"<tool_call>{json.dumps({'name': 'lookup', 'arguments': {'word': word}})}</tool_call>"


@pytest.fixture
def env() -> Iterator[gym.Env]:
    env = gym.make("RLF/ToolUse-v0", **tool_use_kwargs(), max_turns=2)
    yield env
    env.close()


def start(env: gym.Env, index: int = 0, split: str = "train") -> dict:
    """Reset on task ``index`` of ``split``; returns its record."""
    env.reset(seed=0, options={"task_index": index, "split": split})
    return (TRAIN_TASKS if split == "train" else TEST_TASKS)[index]


# --- data -------------------------------------------------------------------------------------------


def test_data_is_a_pure_function_of_the_seed() -> None:
    assert make_codebook(0) == make_codebook(0) == CODEBOOK
    assert make_task_records(0) == make_task_records(0)
    assert make_codebook(1) != make_codebook(0)
    assert make_task_records(1)["test"] != make_task_records(0)["test"]


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_codes_are_distinct_four_digit_numbers_and_never_the_example(seed: int) -> None:
    book = make_codebook(seed)
    assert sorted(book) == sorted(WORDS) and len(set(WORDS)) == len(WORDS)
    assert all(re.fullmatch(r"[1-9]\d{3}", code) for code in book.values())
    assert len(set(book.values())) == len(book)
    assert EXAMPLE_CODE not in book.values() and EXAMPLE_WORD not in book
    assert EXAMPLE_CODE in SYSTEM_PROMPT and EXAMPLE_WORD in SYSTEM_PROMPT


def test_splits_use_disjoint_words_and_questions_carry_the_exact_call() -> None:
    records = make_task_records(0)
    train_words = {r["word"] for r in records["train"]}
    test_words = {r["word"] for r in records["test"]}
    assert len(train_words) == 96 and len(test_words) == 24 and not train_words & test_words
    for record in records["train"] + records["test"]:
        assert record["answer"] == CODEBOOK[record["word"]]
        assert record["question"].endswith("\nReply with exactly: " + call(record["word"]))
    bare = make_task_records(0, with_call_hint=False)
    assert all("<tool_call>" not in r["question"] for r in bare["train"] + bare["test"])


# --- the tool, through the env ------------------------------------------------------------------------


def test_lookup_tool_returns_the_code_and_rejects_unknown_words(env: gym.Env) -> None:
    obs, info = env.reset(seed=0, options={"task_index": 3})
    assert [tool["function"]["name"] for tool in info["tools"]] == ["lookup"]
    assert info["messages"][0]["content"] == SYSTEM_PROMPT
    word = TRAIN_TASKS[3]["word"]
    obs, reward, terminated, truncated, info = env.step(call(f"  '{word.upper()}' "))
    assert obs == f"<tool_response>\n{CODEBOOK[word]}\n</tool_response>"
    assert (reward, terminated, truncated, info["errors"]) == (0.0, False, False, [])

    env.reset(seed=0, options={"task_index": 3})
    obs, _, terminated, _, info = env.step(call("not-a-word"))
    assert not terminated and info["errors"] == ["tool_error"] and "no secret code" in obs


# --- the reward ---------------------------------------------------------------------------------------


def test_right_code_after_the_lookup_scores_one(env: gym.Env) -> None:
    record = start(env, 5)
    env.step(call(record["word"]))
    _, reward, terminated, _, info = env.step(f"<answer>{record['answer']}</answer>")
    assert terminated and reward == 1.0
    assert info["reward_info"] == {
        "reward": 1.0,
        "acc": 1.0,
        "tool_ok": 1.0,
        "tool_called": 1.0,
        "answer_tag": 1.0,
    }


def test_code_stated_without_answer_tags_is_still_correct(env: gym.Env) -> None:
    record = start(env, 2, split="test")
    env.step(call(record["word"]))
    _, reward, _, _, info = env.step(
        f"The secret code is:\n<tool_response>\n{record['answer']}\n</tool_response>"
    )
    assert reward == 1.0 and info["reward_info"]["acc"] == 1.0 and info["reward_info"]["answer_tag"] == 0.0


@pytest.mark.parametrize(
    "final",
    [
        "<answer>{wrong}</answer>",
        "It is {code} or {wrong}.",
        "<answer>{code}{code}</answer>",
        "I do not know.",
    ],
)
def test_a_good_lookup_with_a_wrong_answer_earns_only_the_tool_credit(env: gym.Env, final: str) -> None:
    record = start(env, 7)
    env.step(call(record["word"]))
    wrong = "1111" if record["answer"] != "1111" else "2222"
    _, reward, terminated, _, info = env.step(final.format(code=record["answer"], wrong=wrong))
    assert terminated and reward == pytest.approx(0.3)
    assert info["reward_info"]["acc"] == 0.0 and info["reward_info"]["tool_ok"] == 1.0


def test_looking_up_another_word_earns_nothing_even_with_its_code(env: gym.Env) -> None:
    record = start(env, 0)
    other = TRAIN_TASKS[1]
    obs, *_ = env.step(call(other["word"]))
    _, reward, _, _, info = env.step(f"<answer>{other['answer']}</answer>")
    assert reward == 0.0
    assert info["reward_info"]["tool_called"] == 1.0 and info["reward_info"]["tool_ok"] == 0.0
    assert record["answer"] != other["answer"]


@pytest.mark.parametrize(
    "first", ["<answer>{example}</answer>", "<tool_response>\n{example}\n</tool_response>", "{bad}"]
)
def test_answers_without_a_successful_lookup_earn_nothing(env: gym.Env, first: str) -> None:
    start(env, 4)
    action = first.format(
        example=EXAMPLE_CODE, bad='<tool_call>{"name": "lookup", "arguments": {"word": </tool_call>'
    )
    obs, reward, terminated, truncated, info = env.step(action)
    if not (terminated or truncated):  # the malformed call is an error observation; then a guess
        assert info["errors"] == ["bad_json"]
        _, reward, terminated, truncated, info = env.step(f"<answer>{EXAMPLE_CODE}</answer>")
    assert terminated and reward == 0.0 and info["reward_info"]["acc"] == 0.0


def test_an_episode_cut_off_while_calling_tools_has_no_answer(env: gym.Env) -> None:
    record = start(env, 9)
    env.step(call(record["word"]))
    # The second turn calls again (with the code as its argument): truncated at max_turns, not an answer.
    _, reward, terminated, truncated, info = env.step(call(record["answer"]))
    assert truncated and not terminated
    assert reward == pytest.approx(0.3) and info["reward_info"]["acc"] == 0.0


# --- the training config ----------------------------------------------------------------------------


def test_learning_config_names_this_task_and_makes_a_vector_env() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    env_cfg = config["env"]
    assert env_cfg["id"] == "RLF/Codebook-v0" and "import_kwargs" not in env_cfg
    kwargs = dict(env_cfg.get("kwargs") or {})
    assert env_cfg["num_train_tasks"] == len(TRAIN_TASKS)
    envs = gym.make_vec(
        env_cfg["id"],
        num_envs=2,
        max_turns=config["rollout"]["max_turns"],
        autoreset_mode="Disabled",
        **kwargs,
    )
    try:
        _, infos = envs.reset(options={"task_indices": [0, 0]})
        assert [m["content"] for m in infos["messages"][0]] == [SYSTEM_PROMPT, TRAIN_TASKS[0]["question"]]
        word, code = TRAIN_TASKS[0]["word"], TRAIN_TASKS[0]["answer"]
        guess = "1234" if code != "1234" else "4321"
        _, rewards, terminated, _, _ = envs.step([call(word), f"<answer>{guess}</answer>"])
        assert rewards.tolist() == [0.0, 0.0] and terminated.tolist() == [False, True]
        _, rewards, terminated, _, _ = envs.step([f"<answer>{code}</answer>", ""])
        assert rewards[0] == 1.0 and terminated[0]
    finally:
        envs.close()


def test_codebook_id_passes_check_env_and_matches_tool_use() -> None:
    env = gym.make("RLF/Codebook-v0", max_turns=2)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        _, info = env.reset(seed=0, options={"task_index": 0})
        assert [m["content"] for m in info["messages"]] == [SYSTEM_PROMPT, TRAIN_TASKS[0]["question"]]
        assert [tool["function"]["name"] for tool in info["tools"]] == [TOOL_NAME]
    finally:
        env.close()


def test_tool_success_reward_is_the_step_reward_of_a_good_tool_turn() -> None:
    env = gym.make("RLF/Codebook-v0", tool_success_reward=0.1, max_turns=3)
    try:
        record = start(env, 2)
        _, reward, terminated, _, info = env.step(call(record["word"]))
        assert not terminated and reward == pytest.approx(0.1) and info["turn_reward"] == pytest.approx(0.1)
        _, reward, _, _, info = env.step(call("not-a-word"))  # a failed call earns no step reward
        assert reward == 0.0 and info["turn_reward"] == 0.0
        _, reward, terminated, _, _ = env.step(f"<answer>{record['answer']}</answer>")
        assert terminated and reward == 1.0  # the final reward itself is unchanged
    finally:
        env.close()
