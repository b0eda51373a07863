"""``algorithm.guidance`` in the GRPO step: which groups get a demonstration, and which sample it replaces.

:func:`guide` is step 1b of :func:`rlf_trainer.algorithms.grpo.train_step`: after the rollout, a
demonstrator plays the task of each guided group (:func:`guided_groups`) on the env slot of the
group's worst sample (:func:`worst_sample`), through
:func:`~rlf_trainer.rollout.guidance.play_demonstrations`; the update then trains the
demonstration's tokens with LUFFY's policy shaping
(:func:`~rlf_trainer.algorithms.losses.policy_shaping_terms`).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from rlf_trainer.rollout.batch import RolloutBatch
from rlf_trainer.rollout.collect import Collected, RolloutState
from rlf_trainer.rollout.guidance import DemonstrationRequest, play_demonstrations, replace_episodes
from rlf_trainer.rollout.trajectory import EpisodeStats


def guide(rollout: RolloutState, step: int, collected: Collected) -> tuple[RolloutBatch, dict[str, float]]:
    """``algorithm.guidance``: the step's rollout with demonstrations in place of some samples, and
    ``guidance/*`` metrics (none when guidance is off: the batch is returned as it is).

    Guided groups (:func:`guided_groups`): ``when: all_fail``, those none of whose samples
    succeeded (:func:`succeeded_episode`); ``always``, every group; each with ``probability``. The
    demonstrator plays the group's task on the env slot of the group's worst sample, and the
    demonstration takes that sample's place. Replacing rather than adding a G+1-th keeps every group ``group_size`` long and
    every process's batch the same size, so the update's collectives stay in step. A demonstration
    that fails itself is dropped (the group keeps its sample): it would add no signal. Refill
    rounds (``algorithm.dynamic_sampling``) are the policy's own; guided groups have signal and stay.
    """
    settings, batch = rollout.config.algorithm.guidance, collected.batch
    if not settings.enabled or rollout.demonstrator is None:
        return batch, {}
    started, size = time.perf_counter(), rollout.group_size
    succeeded = [succeeded_episode(s, settings.success_reward) for s in batch.stats]
    requests = [
        DemonstrationRequest(
            slot=worst_sample(batch.stats, g, size), task_index=collected.prompts[g], group=g
        )
        for g in guided_groups(rollout, step, succeeded)
    ]
    played = play_demonstrations(
        rollout.envs,
        rollout.policy.tokenizer,
        rollout.demonstrator,
        requests,
        max_total_tokens=rollout.config.rollout.max_total_tokens,
    )
    kept = {
        r.slot: t
        for r, t in zip(requests, played, strict=True)
        if succeeded_episode(t.stats, settings.success_reward)
    }
    info = {
        "guidance/guided_share": len(kept) / max(1, len(batch) // size),
        "guidance/own_success": float(np.mean(succeeded)) if succeeded else 0.0,
        "time/guidance": time.perf_counter() - started,
    }
    if requests:  # how often the demonstrator itself succeeds (a hop-limited oracle fails on purpose)
        info["guidance/demonstration_success"] = len(kept) / len(requests)
    return replace_episodes(batch, kept, rollout.policy.tokenizer), info


def succeeded_episode(stats: EpisodeStats, success_reward: float) -> bool:
    """Whether an episode solved its task: a return of at least ``success_reward``, or the env's
    verdict (``em``/``acc``) that it is correct, as the eval counts it (a turn cost can hold a
    correct answer's return below 1).

    Example:
        >>> succeeded_episode(EpisodeStats("t", 0, reward=0.7, correct=True), 1.0)
        True
        >>> succeeded_episode(EpisodeStats("t", 0, reward=0.7), 1.0), succeeded_episode(EpisodeStats("t", 0, reward=1.0), 1.0)
        (False, True)
    """
    return stats.reward >= success_reward or bool(stats.correct)


def guided_groups(rollout: RolloutState, step: int, succeeded: list[bool]) -> list[int]:
    """The groups (local indices) a demonstration is played for; each draw is seeded by the run
    seed, the step and the group's index over every process, so a resumed run draws the same."""
    settings, size = rollout.config.algorithm.guidance, rollout.group_size
    first_group = rollout.accelerator.process_index * rollout.local_prompts
    picked = []
    for g in range(len(succeeded) // size):
        if settings.when == "all_fail" and any(succeeded[g * size : (g + 1) * size]):
            continue
        draw = np.random.default_rng(
            [rollout.config.seed & (2**63 - 1), step, first_group + g, 0x6D1DE]
        ).random()
        if settings.probability >= 1.0 or draw < settings.probability:
            picked.append(g)
    return picked


def worst_sample(stats: list[EpisodeStats], group: int, size: int) -> int:
    """The row of group ``group``'s lowest return (the last of equals): the sample a demonstration replaces.

    Example:
        >>> rows = [EpisodeStats("t", 0, reward=r) for r in (0.0, 1.0, 0.0, 0.5)]
        >>> worst_sample(rows, 0, 4)
        2
    """
    rows = range(group * size, (group + 1) * size)
    return min(reversed(rows), key=lambda row: stats[row].reward)


def guided_advantage(stats: list[EpisodeStats], per_turn: list[list[float]]) -> dict[str, float]:
    """``guidance/advantage``: the mean advantage of the demonstrations in the batch (absent without any)."""
    values = [
        statistics.fmean(turns) for s, turns in zip(stats, per_turn, strict=True) if s.demonstration and turns
    ]
    return {"guidance/advantage": statistics.fmean(values)} if values else {}
