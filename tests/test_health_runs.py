"""The health checks on real runs of the tiny Qwen3: each pathology built for real, and a healthy run.

- a prompt over the budget: ``rlf-train`` stops before step 1 with the numbers (exit 3);
- the same prompt let through to a rollout: every episode ends before the model says a word;
- a policy that never varies (greedy): ``no_learning_signal``, and ``health.fail_on`` stops the run;
- a reward paying only for format: ``reward_off_goal``;
- an engine not given the new weights: ``sampler_mismatch``;
- a policy that ends its turns, varies and is paid for the goal: nothing trips.

The envs are RLF/ToolUse-v0 on tiny_test.yaml's echo tasks; the latency MCP server's tool schemas
make the over-budget prompt, the other runs go without tools (short prompts, quick steps).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from rlf_envs.servers.launch import stdio_server_entry
from rlf_trainer.config_sections import HealthConfig
from rlf_trainer.observe.budget import PromptBudgetError, check_prompt_budget, env_prompts
from rlf_trainer.observe.health import CHECK_NAMES, HealthCheckFailed, HealthMonitor
from rlf_trainer.observe.metrics import rollout_metrics
from rlf_trainer.policy.base import SamplingParams
from rlf_trainer.policy.hf import HFPolicy
from rlf_trainer.rollout import chat
from rlf_trainer.rollout.lockstep import run_rollout
from rlf_trainer.trainer import Trainer
from tests.helpers import ANSWER_WORDS, answering_model_path, tiny_config, train_py_command

pytestmark = pytest.mark.timeout(900)
TASKS = [{"id": f"t{i}", "question": f"Echo the word {w}.", "answer": w} for i, w in enumerate(ANSWER_WORDS)]
SHORT_RUN = ("max_steps=3", "eval.every=0", "checkpoint.every=0", "checkpoint.save_final=false",
             "checkpoint.save_model=false", "checkpoint.resume=none")  # fmt: skip


def tool_envs(num_envs: int) -> Any:
    latency = stdio_server_entry("rlf_envs.servers.latency", timeout_s=30)
    return gym.make_vec("RLF/ToolUse-v0", num_envs=num_envs, tasks=TASKS, reward="exact_match",
                        mcp_servers={"mcpServers": {"latency": latency}}, autoreset_mode="Disabled")  # fmt: skip


def run_without_tools(model_dir: Path, run_root: Path, name: str, *overrides: str) -> Any:
    """tiny_test.yaml without its MCP server (prompts of ~110 tokens), logging to ``run_root/name``."""
    config = tiny_config(model_dir, run_root, f"logging.run_name={name}", *SHORT_RUN, *overrides)
    config.env.kwargs.pop("mcp_servers")
    return config


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def format_only_reward(episode: Any) -> dict[str, float]:
    """Pays for answering at all (a format reward), nothing for the answer being right."""
    said = float(bool(episode.final_response.strip()))
    return {"reward": said, "format": said, "em": float(episode.final_answer == episode.instance.answer)}


# ------------------------------------------------------------------------------------------ budget
def test_prompt_budget_counts_the_tool_schemas_with_the_real_template(tiny_tokenizer):
    envs = tool_envs(2)
    try:
        prompts, tools = env_prompts(envs, "train")
        budget = check_prompt_budget(
            tiny_tokenizer, prompts, tools, max_total_tokens=4096, context_length=4096
        )
        _, infos = envs.reset(options={"task_indices": [0, 1], "split": "train"})
    finally:
        envs.close()
    messages = infos["messages"][0]
    rendered = len(chat.prompt_ids(tiny_tokenizer, messages, infos["tools"][0]))
    assert len(prompts) == len(TASKS) and {m["role"] for m in prompts[0][1]} == {"system", "user"}
    assert budget.prompt_tokens == rendered  # the env's own reset prompt, as the rollout renders it
    assert budget.tool_schema_tokens == rendered - len(chat.prompt_ids(tiny_tokenizer, messages, []))
    assert budget.tool_schema_tokens > 300  # the latency server's tools dominate this prompt
    assert budget.system_tokens + budget.tool_schema_tokens + budget.task_tokens == budget.prompt_tokens
    with pytest.raises(PromptBudgetError) as raised:
        check_prompt_budget(tiny_tokenizer, prompts, tools, max_total_tokens=budget.prompt_tokens)
    assert raised.value.budget.room == 0
    assert f"tool schemas {budget.tool_schema_tokens} + " in str(raised.value)
    assert f"= {budget.prompt_tokens} tokens; budget: rollout.max_total_tokens={budget.prompt_tokens}" in str(
        raised.value
    )


def test_rlf_train_stops_before_step_one_when_the_prompt_is_over_budget(tiny_model_dir, tmp_path):
    result = subprocess.run(
        train_py_command(tiny_model_dir, tmp_path, "rollout.max_total_tokens=256", "logging.run_name=over"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr[-2000:]
    line = next(x for x in result.stderr.splitlines() if x.startswith("rlf-train: "))
    assert line.startswith("rlf-train: the prompt does not fit the token budget: system prompt ")
    assert "rollout.max_total_tokens=256, model context 4096. Raise rollout.max_total_tokens" in line
    assert not (tmp_path / "over" / "metrics.jsonl").exists()  # no step ran


def test_a_prompt_over_budget_makes_every_episode_silent_and_trips_over_budget(tiny_model, tiny_tokenizer):
    envs = tool_envs(2)
    try:
        prompts, tools = env_prompts(envs, "train")
        budget = check_prompt_budget(tiny_tokenizer, prompts, tools, max_total_tokens=4096)
        batch = run_rollout(envs, HFPolicy(tiny_model, tiny_tokenizer), [0, 1], group_size=1,
                            sampling=SamplingParams(max_new_tokens=16, seed=0), max_total_tokens=256)  # fmt: skip
    finally:
        envs.close()
    metrics = rollout_metrics(batch.stats)
    assert metrics["silent_at_budget"] == 1.0 and metrics["finish/max_total_tokens"] == 1.0
    monitor = HealthMonitor(
        HealthConfig(), max_total_tokens=256, tool_schema_tokens=budget.tool_schema_tokens
    )
    [trip] = monitor.update(1, metrics).trips
    assert trip.check == "over_budget"
    assert f"({budget.tool_schema_tokens} of them the tool schemas)" in trip.message


# ------------------------------------------------------------------------------------------ runs
def test_a_policy_that_never_varies_has_no_learning_signal_and_fail_on_stops_it(tiny_model_dir, tmp_path):
    config = run_without_tools(tiny_model_dir, tmp_path, "greedy", "rollout.temperature=0", "health.patience=2",
                               "health.fail_on=[no_learning_signal]")  # fmt: skip
    trainer = Trainer(config)
    with pytest.raises(
        HealthCheckFailed, match=r"health check 'no_learning_signal' failed at step 2 .*all-equal"
    ):
        trainer.train()
    metrics = read_jsonl(tmp_path / "greedy" / "metrics.jsonl")
    assert [(r["step"], r["groups/zero_variance"], r["health/no_learning_signal"]) for r in metrics] == [
        (1, 1.0, 0.0),
        (2, 1.0, 1.0),
    ]
    trips = read_jsonl(tmp_path / "greedy" / "health.jsonl")
    assert {"step": 2, "check": "no_learning_signal"}.items() <= next(
        t for t in trips if t["check"] == "no_learning_signal"
    ).items()


def test_a_reward_paying_only_for_format_trips_reward_off_goal(tiny_model, tiny_tokenizer):
    envs = gym.make_vec("RLF/ToolUse-v0", num_envs=4, tasks=TASKS, reward=format_only_reward,
                        autoreset_mode="Disabled")  # fmt: skip
    monitor = HealthMonitor(HealthConfig(patience=2))
    try:
        for step in (1, 2):
            batch = run_rollout(envs, HFPolicy(tiny_model, tiny_tokenizer), [0, 1], group_size=2,
                                sampling=SamplingParams(max_new_tokens=16, seed=step), max_total_tokens=512)  # fmt: skip
            metrics = rollout_metrics(batch.stats)
            report = monitor.update(step, metrics)
    finally:
        envs.close()
    assert (
        metrics["reward/mean"] == 1.0
        and metrics["accuracy"] == 0.0
        and metrics["reward/off_goal_share"] == 1.0
    )
    trip = next(t for t in report.trips if t.check == "reward_off_goal")
    assert "100% of the training reward went to episodes that missed the goal" in trip.message
    assert "format 1.00" in trip.message


def test_an_engine_not_given_new_weights_trips_sampler_mismatch(tiny_model_dir, tmp_path):
    """The policy generates with a frozen copy of the start weights, which drops every weight push,
    while the trainer's copy learns."""

    class DeafPolicy(HFPolicy):  # a sampler whose weight sync is broken
        def update_weights(self, model: torch.nn.Module) -> None:
            """Drops the push: the sampler keeps the start weights."""

    config = run_without_tools(tiny_model_dir, tmp_path, "stale", "optim.lr=0.2", "max_steps=2")
    trainer = Trainer(config)
    frozen = type(trainer.accelerator.unwrap_model(trainer.model)).from_pretrained(
        tiny_model_dir, dtype=torch.float32
    )
    trainer.policy = trainer.rollout.policy = DeafPolicy(frozen, trainer.tokenizer)
    history = trainer.train()
    kl = [r["sampler_kl"] for r in history.records]
    # step 1 samples the start weights; step 2 should not, and its gap is past the check's bound
    assert abs(kl[0]) < 1e-4 and kl[1] > config.health.sampler_kl_max, kl
    assert [r["health/sampler_mismatch"] for r in history.records] == [0.0, 1.0]
    assert [t["check"] for t in read_jsonl(tmp_path / "stale" / "health.jsonl")].count(
        "sampler_mismatch"
    ) == 1


def test_a_healthy_tiny_run_trips_nothing(tmp_path):
    """A policy that ends its turns with an answer, differs within a group and is paid for the right one."""
    config = run_without_tools(
        answering_model_path(), tmp_path, "healthy", "max_steps=4", "algorithm.group_size=4"
    )
    config.env.kwargs["reward"] = "exact_match"
    history = Trainer(config).train()
    assert len(history.records) == 4
    flags = {name: [r[f"health/{name}"] for r in history.records] for name in CHECK_NAMES}
    assert flags == {name: [0.0] * 4 for name in CHECK_NAMES}
    assert not (tmp_path / "healthy" / "health.jsonl").exists()
    mean = {
        key: sum(r[key] for r in history.records) / 4
        for key in ("truncated_turns", "groups/zero_variance", "entropy")
    }
    assert mean["truncated_turns"] < 0.3 and mean["groups/zero_variance"] < 0.9 and mean["entropy"] > 0.02
