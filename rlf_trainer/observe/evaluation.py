"""The periodic evaluation of a run: ``eval.num_prompts`` test prompts, one sample each.

The prompts are a fixed sample of the test split (``eval.sample_seed``), dealt round-robin to the
processes; episode ``p`` of the eval list is seeded by its position, so one process and several
processes play the same eval. Metrics are ``eval/*`` (per ``eval.group_by`` value too) and a few
transcripts go to ``eval_samples.jsonl``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlf_trainer.observe.metrics import (
    append_jsonl,
    eval_prompt_indices,
    grouped_metrics,
    rollout_metrics,
    sample_records,
)
from rlf_trainer.policy.base import SamplingParams
from rlf_trainer.rollout.collect import RolloutState, play
from rlf_trainer.rollout.trajectory import EpisodeStats
from rlf_trainer.run.distributed import mean_over_processes
from rlf_trainer.seeds import SeedKey


def evaluate(rollout: RolloutState, step: int, samples_path: Path | None = None) -> dict[str, float]:
    """Play the eval prompts with the current policy after ``step`` steps; returns ``eval/*`` metrics.

    Needs no model, optimizer or run folder: only what playing needs. With ``samples_path`` (and
    ``logging.samples_jsonl``) a few transcripts are appended there.
    """
    cfg, acc = rollout.config, rollout.accelerator
    prompts = eval_prompt_indices(
        rollout.envs.num_tasks(cfg.env.test_split), cfg.eval.num_prompts, cfg.eval.sample_seed
    )
    mine = prompts[acc.process_index :: acc.num_processes]
    num_envs = rollout.local_episodes
    sampling = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p
    )
    stats: list[EpisodeStats] = []
    transcripts: list[list[dict[str, Any]]] = []
    started = time.perf_counter()
    rollout.policy.wake_up()
    for chunk_start in range(0, len(mine), num_envs):
        chunk = mine[chunk_start : chunk_start + num_envs]
        padded = chunk + [chunk[-1]] * (num_envs - len(chunk))
        # eval episode = the prompt's position in the eval list (dealt round-robin to processes)
        first, stride = acc.process_index + chunk_start * acc.num_processes, acc.num_processes
        seeds = SeedKey(cfg.seed, step, split="eval", first_episode=first, episode_stride=stride)
        batch = play(rollout, padded, sampling, cfg.env.test_split, group_size=1, seeds=seeds)
        stats.extend(batch.stats[: len(chunk)])
        transcripts.extend(batch.transcripts[: len(chunk)])
    rollout.policy.sleep()
    metrics = rollout_metrics(stats, prefix="eval/")
    metrics = {("eval/reward" if k == "eval/reward/mean" else k): v for k, v in metrics.items()}
    if cfg.eval.group_by:
        metrics |= grouped_metrics(stats, cfg.eval.group_by)
    metrics["time/eval"] = time.perf_counter() - started  # not part of time/step
    metrics = mean_over_processes(acc, metrics)
    if cfg.logging.samples_jsonl and samples_path is not None:
        records = sample_records(stats, transcripts, step=step, limit=cfg.eval.samples_to_log, kind="eval")
        if acc.num_processes > 1:  # every process evaluated its share of the prompts
            from accelerate.utils import gather_object

            records = gather_object(records)[: cfg.eval.samples_to_log]
        if acc.is_main_process:
            append_jsonl(samples_path, records)
    return metrics
