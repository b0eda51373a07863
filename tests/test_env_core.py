"""ToolEnv / ToolVectorEnv behaviour with python-function tools (MCP-backed tests live elsewhere)."""

import asyncio
import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_envs.core.env import ToolEnv
from rlf_envs.core.task import FunctionTask
from rlf_envs.core.vector import ToolVectorEnv
from rlf_envs.tasks.tool_use import make_tool_use_task
from rlf_envs.types import TaskInstance

TASKS = [{"id": f"q{i}", "question": f"What is {i} squared?", "answer": str(i * i)} for i in range(10)]


def square(n: int) -> int:
    """Square an integer.

    Args:
        n: the number to square
    """
    return n * n


class Gauge:
    """Counts how many calls of an async tool are in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0

    async def wait(self, ms: float = 20.0) -> str:
        """Wait a while, recording concurrency."""
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(ms / 1000)
        self.in_flight -= 1
        return "waited"


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def make_env(**kwargs):
    return gym.make("RLF/ToolUse-v0", tasks=TASKS, reward="exact_match", python_tools=[square], **kwargs)


def test_tool_use_env_passes_check_env():
    env = make_env()
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_episode_with_tool_then_answer():
    env = make_env(max_turns=3)
    obs, info = env.reset(seed=0, options={"task_index": 3})
    assert obs == "What is 3 squared?"
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert info["tools"][0]["function"]["name"] == "square"
    assert info["tools"][0]["function"]["parameters"]["properties"]["n"]["type"] == "integer"

    obs, reward, terminated, truncated, info = env.step("I will compute. " + call("square", n=3))
    assert obs == "<tool_response>\n9\n</tool_response>"
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["tool_messages"] == [
        {"role": "tool", "name": "square", "tool_call_id": info["tool_calls"][0]["id"], "content": "9"}
    ]
    assert info["tool_calls"][0]["ok"] and info["errors"] == []
    assistant = info["messages"][-2]
    assert (
        assistant["content"] == "I will compute."
        and assistant["tool_calls"][0]["function"]["name"] == "square"
    )

    obs, reward, terminated, truncated, info = env.step("<answer>9</answer>")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert info["answer"] == "9" and info["reward_info"]["em"] == 1.0
    assert "episode_stats" not in info  # the trainer counts turns and calls itself
    env.close()


def test_wrong_answer_and_plain_text_score_zero():
    env = make_env()
    env.reset(seed=1, options={"task_index": 2})
    assert env.step("<answer>5</answer>")[1] == 0.0
    env.reset(seed=1, options={"task_index": 2})
    _, reward, terminated, _, info = env.step("I think it is four")
    assert (reward, terminated, info["answer"]) == (0.0, True, None)
    env.close()


@pytest.mark.parametrize(
    ("action", "kind"),
    [
        ("<tool_call>{broken</tool_call>", "bad_json"),
        ('<tool_call>{"arguments": {}}</tool_call>', "bad_format"),
        (call("cube", n=2), "unknown_tool"),
        (call("square", n="two"), "bad_arguments"),
        (call("square"), "bad_arguments"),
    ],
)
def test_errors_become_observations(action, kind):
    env = make_env()
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["errors"] == [kind]
    assert f"Error ({kind})" in obs
    assert not terminated and not truncated
    assert info["tool_calls"][0]["error"] == kind
    env.close()


def test_max_turns_truncates_and_scores():
    env = make_env(max_turns=2)
    env.reset(seed=0, options={"task_index": 4})
    assert env.step(call("square", n=4))[3] is False
    obs, reward, terminated, truncated, info = env.step(call("square", n=4))
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert obs.startswith("<tool_response>") and "reward_info" in info
    with pytest.raises(RuntimeError):
        env.unwrapped.step("again")
    env.close()


def test_result_truncation_and_call_limit():
    def blob(n: int) -> str:
        """Return n characters."""
        return "x" * n

    env = gym.make(
        "RLF/ToolUse-v0", tasks=TASKS, python_tools=[blob], max_result_chars=100, max_calls_per_turn=2
    )
    env.reset(seed=0)
    _, _, _, _, info = env.step(call("blob", n=10_000) * 3)
    contents = [m["content"] for m in info["tool_messages"]]
    assert len(contents[0]) <= 100 and "truncated" in contents[0] and info["tool_calls"][0]["truncated"]
    assert info["errors"] == ["too_many_calls"]
    env.close()


def test_tool_exception_and_reward_exception_never_raise():
    def boom() -> str:
        """Always fails."""
        raise RuntimeError("kaput")

    def bad_reward(episode):
        raise ValueError("reward bug")

    env = ToolEnv(make_tool_use_task(tasks=TASKS, reward=bad_reward, python_tools=[boom]))
    env.reset(seed=0)
    obs, *_rest, info = env.step(call("boom"))
    assert info["errors"] == ["tool_error"] and "kaput" in obs
    _, reward, terminated, _, info = env.step("<answer>1</answer>")
    assert reward == 0.0 and terminated and "reward bug" in info["reward_info"]["reward_error"]
    env.close()


def test_async_reward_and_ansi_render():
    async def judge(episode):
        await asyncio.sleep(0)
        return {"reward": 0.5, "judge": "half"}

    task = FunctionTask("t", [TaskInstance("0", "hi?", "hi")], judge)
    env = ToolEnv(task, render_mode="ansi")
    env.reset(seed=0)
    _, reward, _, _, info = env.step("<answer>hi</answer>")
    assert reward == 0.5 and info["reward_info"]["judge"] == "half"
    assert "[user] hi?" in env.render() and "[assistant] <answer>hi</answer>" in env.render()
    env.close()


def test_vector_env_runs_all_calls_of_a_step_concurrently():
    gauge = Gauge()
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=32, tasks=TASKS, python_tools=[gauge.wait], max_turns=3)
    assert isinstance(envs.unwrapped, ToolVectorEnv)
    assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    obs, infos = envs.reset(seed=0)
    assert len(obs) == 32 and obs in envs.observation_space
    actions = [call("wait", ms=200) * 2 for _ in range(32)]
    obs, rewards, terminated, truncated, infos = envs.step(actions)
    assert gauge.peak == 64
    assert all(o.count("waited") == 2 for o in obs)
    assert infos["_tool_calls"].all() and len(infos["tool_calls"][5]) == 2
    envs.close()


def test_vector_env_next_step_autoreset_and_rewards():
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=4, tasks=TASKS, python_tools=[square])
    obs, infos = envs.reset(seed=0, options={"task_indices": [1, 2, 3, 4]})
    assert list(infos["task_id"]) == ["q1", "q2", "q3", "q4"]
    actions = ["<answer>1</answer>", "<answer>0</answer>", call("square", n=3), "no idea"]
    obs, rewards, terminated, truncated, infos = envs.step(actions)
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert terminated.tolist() == [True, True, False, True]
    assert obs[2] == "<tool_response>\n9\n</tool_response>"
    obs, rewards, terminated, truncated, infos = envs.step(
        ["ignored", "ignored", "<answer>9</answer>", "ignored"]
    )
    assert rewards.tolist() == [0.0, 0.0, 1.0, 0.0]
    assert obs[0].startswith("What is") and infos["_messages"].tolist() == [True, True, True, True]
    assert terminated.tolist() == [False, False, True, False]
    envs.close()


def test_vector_env_same_step_and_disabled_autoreset():
    envs = ToolVectorEnv(make_tool_use_task(tasks=TASKS), 2, autoreset_mode="SameStep")
    envs.reset(seed=0, options={"task_indices": [5, 6]})
    obs, rewards, terminated, _, infos = envs.step(["<answer>25</answer>", "<answer>1</answer>"])
    assert rewards.tolist() == [1.0, 0.0] and terminated.all()
    assert all(o.startswith("What is") for o in obs)
    assert infos["final_info"]["answer"].tolist() == ["25", "1"]
    envs.close()

    envs = ToolVectorEnv(make_tool_use_task(tasks=TASKS), 2, autoreset_mode=AutoresetMode.DISABLED)
    envs.reset(seed=0, options={"task_indices": [5, 6]})
    envs.step(["<answer>25</answer>", call("nothing")])
    obs, rewards, terminated, truncated, infos = envs.step(["ignored", "<answer>36</answer>"])
    assert obs[0] == "" and infos["inactive"][0] and terminated.tolist() == [True, True]
    assert rewards.tolist() == [0.0, 1.0]
    envs.close()


def test_async_step_one_from_a_foreign_loop():
    envs = ToolVectorEnv(make_tool_use_task(tasks=TASKS, python_tools=[square]), 3, autoreset_mode="Disabled")
    envs.reset(seed=0, options={"task_indices": [7, 8, 9]})

    async def drive():
        return await asyncio.gather(
            envs.astep_one(0, "<answer>49</answer>"),
            envs.astep_one(1, call("square", n=8)),
            envs.astep_one(2, "<answer>0</answer>"),
        )

    results = asyncio.run(drive())
    assert [r[1] for r in results] == [1.0, 0.0, 0.0]
    assert results[1][0] == "<tool_response>\n64\n</tool_response>"
    assert envs.messages(1)[-1]["role"] == "tool"
    envs.close()


def test_seeded_reset_is_deterministic():
    a = ToolVectorEnv(make_tool_use_task(tasks=TASKS), 5)
    b = ToolVectorEnv(make_tool_use_task(tasks=TASKS), 5)
    assert a.reset(seed=7)[0] == b.reset(seed=7)[0]
    assert np.array_equal(a.reset(seed=8)[1]["task_id"], b.reset(seed=8)[1]["task_id"])
    a.close()
    b.close()


def test_num_tasks_and_split_persistence():
    envs = ToolVectorEnv(make_tool_use_task(tasks=TASKS, test_tasks=TASKS[:3]), 2)
    assert envs.num_tasks() == 10 and envs.num_tasks("test") == 3
    envs.reset(seed=0, options={"split": "test"})
    assert envs.num_tasks() == 3
    _, infos = envs.reset(seed=1)
    assert set(infos["task_id"]) <= {"q0", "q1", "q2"}
    envs.close()
