"""The rollout side of a GRPO step: what a step samples, with which seeds, and the overlap prefetch.

:func:`collect` plays this process's share of a step's prompts x ``group_size`` episodes with the
policy, lockstep or async (``rollout.mode``, :func:`play`); with ``rollout.overlap`` the next
step's batch is already being collected on a worker thread while this one trains
(:class:`Prefetch`, staleness 1). :class:`StepParts` is everything a step touches; the trainer
builds it once and :mod:`rlf_trainer.grpo` runs the step on it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rlf_trainer.config import Config
from rlf_trainer.policy.base import Policy, SamplingParams
from rlf_trainer.prompts import PromptSampler
from rlf_trainer.rollout import run_rollout
from rlf_trainer.rollout_async import run_async_rollout
from rlf_trainer.rollout_batch import RolloutBatch
from rlf_trainer.seeds import SeedKey


@dataclass
class StepParts:
    """Everything a step touches; the trainer builds it once. ``weights_version`` counts syncs."""

    config: Config
    accelerator: Any
    model: Any
    ref_model: Any | None
    optimizer: Any
    scheduler: Any
    policy: Policy
    envs: Any
    sampler: PromptSampler
    local_prompts: int
    weights_version: int = 0

    @property
    def group_size(self) -> int:
        return self.config.algorithm.group_size


@dataclass
class Collected:
    """A rollout and the weights version that sampled it (``staleness`` = trainer version - this)."""

    batch: RolloutBatch
    version: int


def sampling_params(config: Config) -> SamplingParams:
    """The train rollout's sampling settings (``rollout.*``); the seeds come per request (:class:`SeedKey`)."""
    r = config.rollout
    return SamplingParams(
        max_new_tokens=r.max_new_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
    )


def play(
    parts: StepParts,
    prompts: list[int],
    sampling: SamplingParams,
    split: str,
    *,
    group_size: int,
    seeds: SeedKey,
) -> RolloutBatch:
    """One batch of episodes, ``prompts`` x ``group_size``, in the configured rollout mode."""
    cfg = parts.config
    common = dict(
        group_size=group_size,
        sampling=sampling,
        seeds=seeds,
        max_total_tokens=cfg.rollout.max_total_tokens,
        split=split,
    )
    if cfg.rollout_mode == "async":
        return run_async_rollout(
            parts.envs,
            parts.policy,
            prompts,
            max_concurrent_episodes=cfg.rollout.max_concurrent_episodes,
            **common,
        )
    return run_rollout(parts.envs, parts.policy, prompts, **common)


def collect(parts: StepParts, step: int, refill_round: int = 0) -> Collected:
    """This process's episodes of step ``step`` (or of one of its refill rounds)."""
    cfg, acc = parts.config, parts.accelerator
    if refill_round == 0:
        everyone = parts.sampler.indices(step, cfg.rollout.prompts_per_step)
    else:
        everyone = parts.sampler.refill_indices(step, refill_round, cfg.rollout.prompts_per_step)
    mine = everyone[acc.process_index * parts.local_prompts : (acc.process_index + 1) * parts.local_prompts]
    # Episode e of the step (over all processes) is seeded by its global index: a 2-process run
    # samples each episode with the seed a 1-process run gives it.
    local_episodes = parts.local_prompts * parts.group_size
    seeds = SeedKey(cfg.seed, step, refill_round, first_episode=acc.process_index * local_episodes)
    version = parts.weights_version
    parts.policy.wake_up()
    batch = play(
        parts, mine, sampling_params(cfg), cfg.env.train_split, group_size=parts.group_size, seeds=seeds
    )
    if not cfg.rollout.overlap:  # under overlap the engine stays up for the next rollout
        parts.policy.sleep()
    return Collected(batch, version)


class Prefetch:
    """``rollout.overlap``: collect step k+1 on a worker thread while step k trains.

    The engine keeps the weights it had when the rollout began (the update only reaches it at the
    next sync, after the rollout is joined), so the batch is exactly one version stale.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlf-prefetch")
        self._pending: tuple[int, Future[Collected]] | None = None

    def start(self, parts: StepParts, step: int) -> None:
        self._pending = (step, self._pool.submit(collect, parts, step))

    def take(self, step: int) -> Collected | None:
        """The prefetched batch of ``step`` (None when none was started for it)."""
        if self._pending is None or self._pending[0] != step:
            return None
        _, future = self._pending
        self._pending = None
        return future.result()

    def join(self) -> None:
        """Wait for the in-flight rollout (the engine must be idle before a weight sync)."""
        if self._pending is not None:
            self._pending[1].exception()

    def close(self) -> None:
        self.join()
        self._pool.shutdown(wait=True)


__all__ = ["Collected", "Prefetch", "StepParts", "collect", "play", "sampling_params"]
