"""End-to-end GRPO step time with and without ``rollout.overlap`` on the rollout bench's workload.

The trainer (vLLM backend, async rollout) trains the tiny random Qwen3 for ``steps`` steps on the
rollout bench's env (``RLF/ToolUse-v0`` over the heavy-tailed latency server, every turn a tool
call), ``episodes`` episodes a step (``episodes / group_size`` prompts x ``group_size``), once
with ``rollout.overlap: false`` and once with ``true``. The figure is the median ``time/step`` of
the steps after the first (step 1 cannot overlap anything and carries the warm-up); with overlap a
step costs about ``max(rollout, train + sync)`` instead of their sum, so the gain is bounded by the
share of the step that training takes.

The reward is :func:`spread_reward` (a function of the text): a random model gets different
rewards within a group, so every step runs a real update.

Example::

    rlf-bench rollout --train-steps 4 --json     # the rollout figures, then these
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rlf_bench.rollout_workload import AlwaysSleepParser, RolloutBenchSettings, bench_tasks, latency_server

GROUP_SIZE = 4


def spread_reward(episode: Any) -> float:
    """A deterministic reward with spread for a random model: the last turn's text, hashed to [0, 1].

    Example:
        >>> from types import SimpleNamespace
        >>> spread_reward(SimpleNamespace(final_response="a")), spread_reward(SimpleNamespace(final_response="b"))
        (0.5, 0.75)
    """
    return (sum(map(ord, episode.final_response)) % 5) / 4


def overlap_config(
    settings: RolloutBenchSettings, model_dir: str, run_dir: Path, steps: int, overlap: bool
) -> Any:
    """The trainer config of one arm of the comparison."""
    from rlf_trainer.config import load_config

    config = load_config(
        None,
        [
            f"model.path={model_dir}",
            "env.id=RLF/ToolUse-v0",
            f"rollout.prompts_per_step={settings.episodes // GROUP_SIZE}",
            f"rollout.max_turns={settings.tool_turns}",
            f"rollout.max_new_tokens={settings.max_new_tokens}",
            "rollout.max_total_tokens=4096",
            "rollout.mode=async",
            f"rollout.overlap={str(overlap).lower()}",
            f"algorithm.group_size={GROUP_SIZE}",
            "algorithm.beta=0",
            "optim.lr=1e-4",
            "policy.backend=vllm",
            "policy.vllm.dtype=float32",
            "policy.vllm.max_model_len=4096",
            "policy.vllm.gpu_memory_utilization=0.5",
            "eval.every=0",
            "checkpoint.every=0",
            "checkpoint.save_final=false",
            "checkpoint.save_model=false",
            "logging.progress_bar=false",
            "logging.samples_jsonl=false",
            f"logging.dir={run_dir}",
            f"logging.run_name=overlap_{overlap}",
            f"max_steps={steps}",
        ],
    )
    tasks = bench_tasks()
    config.env.kwargs = {
        "mcp_servers": {"mcpServers": {"latency": latency_server(settings, seed=0)}},
        "tasks": tasks,
        "reward": spread_reward,
        "parser": AlwaysSleepParser(),
    }
    config.env.num_train_tasks = len(tasks)
    return config.validate()


def run_overlap_bench(
    settings: RolloutBenchSettings, model_dir: str, workdir: Path, steps: int, progress: Any = print
) -> dict[str, Any]:
    """Median step seconds (steps 2..N) without and with overlap, and their ratio."""
    from rlf_trainer.trainer import Trainer

    if steps < 2:
        raise ValueError("--train-steps must be >= 2: the first step is not timed")
    arms: dict[str, dict[str, Any]] = {}
    for overlap in (False, True):
        config = overlap_config(settings, model_dir, workdir / "runs", steps, overlap)
        records = Trainer(config).train().records[1:]
        arm = {
            key: statistics.median(r[key] for r in records)
            for key in ("time/step", "time/rollout", "time/train", "time/sync")
        }
        arm["staleness"] = [r["rollout/staleness"] for r in records]
        arm["sampler_kl"] = [r["sampler_kl"] for r in records]
        arms["overlap" if overlap else "sequential"] = arm
        progress(f"train steps, overlap={overlap}: median step {arm['time/step']:.2f} s")
    return {
        "train_steps": steps,
        "episodes_per_step": settings.episodes,
        "sequential": arms["sequential"],
        "overlap": arms["overlap"],
        "overlap_speedup": round(arms["sequential"]["time/step"] / arms["overlap"]["time/step"], 3),
    }


def format_overlap_report(report: dict[str, Any]) -> str:
    lines = [
        f"train step ({report['episodes_per_step']} episodes, median of steps 2..{report['train_steps']}):"
    ]
    for arm in ("sequential", "overlap"):
        row = report[arm]
        lines.append(
            f"  {arm:10s} step {row['time/step']:6.2f} s  (rollout {row['time/rollout']:.2f} s, "
            f"train {row['time/train']:.2f} s, sync {row['time/sync']:.2f} s)"
        )
    lines.append(f"  overlap speed-up {report['overlap_speedup']:.2f}x")
    return "\n".join(lines)


__all__ = ["format_overlap_report", "overlap_config", "run_overlap_bench", "spread_reward"]
