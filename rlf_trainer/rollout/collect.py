"""The rollout side of a GRPO step: what a step samples, with which seeds, and the overlap prefetch.

:func:`collect` plays this process's share of a step's prompts x ``group_size`` episodes with the
policy, lockstep or async (``rollout.mode``, :func:`play`); with ``rollout.overlap`` the next
step's batch is already being collected on a worker thread while this one trains
(:class:`Prefetch`, staleness 1). :class:`RolloutState` is everything playing episodes touches
(no model, no optimizer): the trainer builds it once, and an evaluation needs nothing else.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlf_trainer.config import Config, ConfigError
from rlf_trainer.policy.base import Policy, SamplingParams
from rlf_trainer.prompts import PromptSampler
from rlf_trainer.rollout.async_rollout import run_async_rollout
from rlf_trainer.rollout.batch import RolloutBatch
from rlf_trainer.rollout.guidance import Demonstrator
from rlf_trainer.rollout.lockstep import run_rollout
from rlf_trainer.seeds import SeedKey


def prompts_per_process(config: Config, processes: int) -> int:
    """This process's share of ``rollout.prompts_per_step`` (every group stays on one process)."""
    if config.rollout.prompts_per_step % processes:
        raise ConfigError(
            f"rollout.prompts_per_step={config.rollout.prompts_per_step} must be a multiple of "
            f"the {processes} processes"
        )
    return config.rollout.prompts_per_step // processes


def episodes_per_process(config: Config, processes: int) -> int:
    """This process's episodes per step, which is also the number of envs it runs."""
    return prompts_per_process(config, processes) * config.algorithm.group_size


@dataclass
class RolloutState:
    """What playing episodes needs: the config, the processes, the policy, the envs and the prompt
    stream (None for an evaluation). ``weights_version`` counts the weight syncs the policy got.
    ``demonstrator``: ``algorithm.guidance``'s agent (:mod:`rlf_trainer.rollout.guidance`), built by
    the trainer; None without guidance."""

    config: Config
    accelerator: Any
    policy: Policy
    envs: Any
    sampler: PromptSampler | None = None
    weights_version: int = 0
    demonstrator: Demonstrator | None = None

    @property
    def group_size(self) -> int:
        return self.config.algorithm.group_size

    @property
    def local_prompts(self) -> int:
        """This process's prompts per step."""
        return prompts_per_process(self.config, self.accelerator.num_processes)

    @property
    def local_episodes(self) -> int:
        """This process's episodes per step, which is also the number of envs it runs."""
        return episodes_per_process(self.config, self.accelerator.num_processes)


@dataclass
class Collected:
    """A rollout, the weights version that sampled it (``staleness`` = trainer version - this) and
    its prompts (task indices, one per group)."""

    batch: RolloutBatch
    version: int
    prompts: list[int] = field(default_factory=list)


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
    rollout: RolloutState,
    prompts: list[int],
    sampling: SamplingParams,
    split: str,
    *,
    group_size: int,
    seeds: SeedKey,
) -> RolloutBatch:
    """One batch of episodes, ``prompts`` x ``group_size``, in the configured rollout mode."""
    cfg = rollout.config
    common = dict(
        group_size=group_size,
        sampling=sampling,
        seeds=seeds,
        max_total_tokens=cfg.rollout.max_total_tokens,
        split=split,
    )
    if cfg.rollout.mode == "async":
        return run_async_rollout(
            rollout.envs,
            rollout.policy,
            prompts,
            max_concurrent_episodes=cfg.rollout.max_concurrent_episodes,
            **common,
        )
    return run_rollout(rollout.envs, rollout.policy, prompts, **common)


def collect(rollout: RolloutState, step: int, refill_round: int = 0) -> Collected:
    """This process's episodes of step ``step`` (or of one of its refill rounds)."""
    cfg, acc, sampler = rollout.config, rollout.accelerator, rollout.sampler
    if sampler is None:
        raise ValueError("collect() needs a prompt sampler: this RolloutState was built for evaluation")
    if refill_round == 0:
        everyone = sampler.indices(step, cfg.rollout.prompts_per_step)
    else:
        everyone = sampler.refill_indices(step, refill_round, cfg.rollout.prompts_per_step)
    mine = everyone[
        acc.process_index * rollout.local_prompts : (acc.process_index + 1) * rollout.local_prompts
    ]
    # Episode e of the step (over all processes) is seeded by its global index: a 2-process run
    # samples each episode with the seed a 1-process run gives it.
    seeds = SeedKey(cfg.seed, step, refill_round, first_episode=acc.process_index * rollout.local_episodes)
    version = rollout.weights_version
    rollout.policy.wake_up()
    batch = play(
        rollout, mine, sampling_params(cfg), cfg.env.train_split, group_size=rollout.group_size, seeds=seeds
    )
    if not cfg.rollout.overlap:  # under overlap the engine stays up for the next rollout
        rollout.policy.sleep()
    # a policy that tags its samples (remote servers) knows better than the version at the start
    tags = [s.weights_version for s in batch.stats if s.weights_version is not None]
    return Collected(batch, min(tags, default=version), [int(p) for p in mine])


def rolls_ahead(config: Config) -> bool:
    """Whether the next step's rollout runs while this step trains (a :class:`Prefetch`).

    The colocated vLLM with ``rollout.overlap`` (staleness 1). The remote backend when
    ``rollout.max_staleness`` leaves room for one more version besides the servers' own lag
    (``policy.remote.sync_every - 1``): the rollout of step k+1 starts on weights of step k or
    older, so it runs at most ``sync_every`` versions behind.

    Example:
        >>> from rlf_trainer.config import from_dict
        >>> remote = {"backend": "remote", "remote": {"urls": ["http://h:1"], "sync_every": 2}}
        >>> [rolls_ahead(from_dict({"policy": remote, "rollout": {"max_staleness": s}})) for s in (1, 2)]
        [False, True]
    """
    r = config.rollout
    if config.policy.backend == "remote":
        return r.max_staleness >= max(1, config.policy.remote.sync_every)
    return r.overlap


class Prefetch:
    """Collect step k+1 on a worker thread while step k trains (:func:`rolls_ahead`).

    The colocated engine keeps the weights it had when the rollout began (the update only reaches
    it at the next sync, after the rollout is joined), so the batch is exactly one version stale.
    Remote servers take the new weights while the rollout goes on (their requests in flight finish
    first); each sample records the version that drew it.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlf-prefetch")
        self._pending: tuple[int, Future[Collected]] | None = None

    def start(self, rollout: RolloutState, step: int) -> None:
        self._pending = (step, self._pool.submit(collect, rollout, step))

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


__all__ = [
    "Collected",
    "Prefetch",
    "RolloutState",
    "collect",
    "play",
    "prompts_per_process",
    "rolls_ahead",
    "sampling_params",
]
