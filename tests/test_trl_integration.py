"""TRL's real GRPOTrainer on an RLF env (rlf_envs.integrations.trl_environment): TRL generates, our env
executes the tool calls and scores, and our reward reaches TRL's logged metrics.

The tiny random Qwen3 cannot choose to call a tool, so one test biases its sampling (a
``sequence_bias`` ladder in TRL's ``generation_kwargs``) until every completion is the same
well-formed ``add`` call: TRL's own tool loop then parses it and calls our env.
"""

import asyncio
import inspect
import json
import math
import os

import pytest

pytest.importorskip("trl")
pytest.importorskip("datasets")

from rlf_envs.integrations.trl_environment import (  # noqa: E402
    cpu_grpo_config,
    env_dataset,
    make_trl_environment,
    prepare_tokenizer,
    rlf_env_reward,
)
from tests.helpers import tiny_server  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

TASKS = [{"question": f"What is {i} + 3? Use the add tool.", "answer": str(i + 3)} for i in range(4)]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


class RewardLog:
    """Our env's reward function for the test: remembers what it scored, pays for successful tool calls.

    reward = 0.5 + (successful tool calls in the episode) + (length of the final text mod 3) / 10, so
    TRL's logged mean can only match if every value came from here and the tool calls really ran.
    """

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.episodes: list = []

    def __call__(self, episode) -> float:
        ok_calls = sum(1 for call in episode.tool_calls if call["ok"])
        reward = 0.5 + ok_calls + (len(episode.final_response) % 3) / 10
        self.rewards.append(reward)
        self.episodes.append(episode)
        return reward


def _trainer(model_dir, tmp_path, reward_log, *, steps, generation_kwargs=None, max_completion_length=24):
    from trl import GRPOTrainer

    prompts, generations = 2, 2
    env_kwargs = {"tasks": TASKS, "python_tools": [add], "reward": reward_log, "max_turns": 3}
    Env = make_trl_environment("RLF/ToolUse-v0", capacity=prompts * generations, **env_kwargs)
    config = cpu_grpo_config(
        tmp_path / "trl",
        prompts=prompts,
        generations=generations,
        max_turns=2,  # one tool round, then the answer
        max_completion_length=max_completion_length,
        max_steps=steps,
        learning_rate=1e-4,
        generation_kwargs=generation_kwargs,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        reward_funcs=[rlf_env_reward],
        args=config,
        train_dataset=env_dataset("RLF/ToolUse-v0", prompts * steps, **env_kwargs),
        processing_class=prepare_tokenizer(model_dir),
        environment_factory=Env,
    )
    return trainer, Env


def _train_logs(trainer):
    trainer.train()
    return [record for record in trainer.state.log_history if "rewards/rlf_env_reward/mean" in record]


def test_env_class_exposes_our_tools_to_trl_and_runs_them_through_the_env():
    from transformers.utils import get_json_schema

    reward_log = RewardLog()
    servers = {"mcpServers": {"tiny": tiny_server()}}
    Env = make_trl_environment(
        "RLF/ToolUse-v0", capacity=2, tasks=TASKS, mcp_servers=servers, python_tools=[add], reward=reward_log
    )
    try:
        tool_names = sorted(
            name
            for name, _ in inspect.getmembers(Env, predicate=inspect.isfunction)
            if not name.startswith("_")
        )
        env_tools = {t["function"]["name"]: t["function"] for t in Env._vec.tools}
        assert tool_names == sorted([*env_tools, "reset"])
        first, second = Env(), Env()
        with pytest.raises(RuntimeError, match="slots"):
            Env()
        # the schema TRL renders (transformers reads signature + docstring) is the env's schema
        schema = get_json_schema(first.add)["function"]
        assert schema["name"] == "add" and set(schema["parameters"]["required"]) == {"a", "b"}
        assert schema["parameters"]["properties"]["a"]["type"] == "integer"

        first.reset(task_index=1)
        second.reset(task_index=2)
        assert asyncio.run(first.add(a=40, b=2)) == "42"
        echo_tool = next(name for name in env_tools if name.endswith("echo"))
        assert "hello" in asyncio.run(getattr(second, echo_tool)(text="hello"))
        finals = ["<answer>4</answer>", "I think it is <answer>x</answer>"]
        rewards = asyncio.run(
            rlf_env_reward([[{"role": "assistant", "content": finals[0]}], finals[1]], [first, second])
        )
        # one successful call each, plus the length term of each final text
        assert rewards == pytest.approx([1.5 + (len(f) % 3) / 10 for f in finals])
        assert reward_log.rewards == rewards
        assert [ep.instance.id for ep in reward_log.episodes] == ["1", "2"]
        assert [ep.final_answer for ep in reward_log.episodes] == ["4", "x"]
    finally:
        Env.close()


def test_grpo_steps_log_our_env_reward(tiny_model_dir, tmp_path):  # noqa: F811
    reward_log = RewardLog()
    trainer, Env = _trainer(tiny_model_dir, tmp_path, reward_log, steps=2)
    try:
        logs = _train_logs(trainer)
    finally:
        Env.close()
    assert len(logs) == 2 and len(reward_log.rewards) == 8
    for step, record in enumerate(logs):
        ours = reward_log.rewards[4 * step : 4 * step + 4]
        assert record["rewards/rlf_env_reward/mean"] == pytest.approx(sum(ours) / 4, abs=1e-5)
        assert math.isfinite(record["loss"])
    # each rollout's episode was reset onto its dataset row and ended with TRL's completion
    assert {ep.instance.id for ep in reward_log.episodes} <= {"0", "1", "2", "3"}
    assert all(ep.terminated for ep in reward_log.episodes)


def test_trl_tool_loop_calls_run_in_our_env(tiny_model_dir, tmp_path):  # noqa: F811
    tokenizer = prepare_tokenizer(tiny_model_dir)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
    ids = tokenizer(call, add_special_tokens=False)["input_ids"]
    # a bias that grows with the matched prefix: the random model writes exactly this call, every turn
    ladder = [[ids[: k + 1], 30.0 + 10.0 * k] for k in range(len(ids))]
    reward_log = RewardLog()
    trainer, Env = _trainer(
        tiny_model_dir,
        tmp_path,
        reward_log,
        steps=1,
        generation_kwargs={"sequence_bias": ladder},
        max_completion_length=4 * len(ids) + 32,
    )
    try:
        (record,) = _train_logs(trainer)
    finally:
        Env.close()
    assert record["tools/call_frequency"] > 0 and record["tools/failure_frequency"] == 0
    for episode in reward_log.episodes:
        calls = [c for c in episode.tool_calls if c["name"] == "add"]
        assert calls and all(c["ok"] and c["arguments"] == {"a": 2, "b": 3} for c in calls)
        tool_results = [m["content"] for m in episode.messages if m["role"] == "tool"]
        assert "5" in tool_results
    assert min(reward_log.rewards) >= 1.5  # 0.5 + at least one successful call
    assert record["rewards/rlf_env_reward/mean"] == pytest.approx(sum(reward_log.rewards) / 4, abs=1e-5)
    json.dumps(record)


def test_rlf_bench_train_runs_both_trainers_on_one_shape_report_shape(tmp_path, capsys):
    """Both trainers run on the asked shape; the ratios checked are the report's own arithmetic."""
    import torch

    from rlf_bench.train_bench import main

    threads = torch.get_num_threads()
    try:
        argv = ["--steps", "2", "--prompts", "1", "--generations", "2", "--max-new-tokens", "8"]
        assert main([*argv, "--workdir", str(tmp_path), "--json"]) == 0
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.strip().splitlines()
    report = json.loads(lines[-1])
    assert (
        report["shape"]["prompts"] == 1
        and report["shape"]["generations"] == 2
        and report["torch_threads"] == 1
    )
    for name in ("rlf", "trl"):
        figures = report[name]
        assert (
            figures["timed_steps"] == 1 and len(figures["step_s"]) == 2 and len(figures["reward_mean"]) == 2
        )
        assert figures["samples_per_s"] == pytest.approx(2 / figures["step_s"][1])
    assert report["rlf_over_trl"] == pytest.approx(
        report["rlf"]["samples_per_s"] / report["trl"]["samples_per_s"]
    )
    assert any(line.startswith("  rlf / TRL") for line in lines[:-1])
