"""Every sampling seed of a run from one function: :func:`sample_seed`.

A request's seed is a hash (``numpy.random.SeedSequence``) of what identifies it: the run seed,
the split (train or eval), the step, the dynamic-sampling refill round, the episode's *global*
index in the step (``rank * episodes_per_process + local index``) and the turn. So a run is
reproducible, no two requests of a run share a seed, and a 2-process run draws, for a given
episode, the seed a 1-process run draws for it (the rank is in the episode index, not beside it).

Example:
    >>> a = sample_seed(0, step=3, refill_round=0, episode=5, turn=1)
    >>> a == sample_seed(0, step=3, refill_round=0, episode=5, turn=1)
    True
    >>> a != sample_seed(0, step=3, refill_round=0, episode=5, turn=2) != sample_seed(0, step=3, refill_round=1, episode=5, turn=1)
    True
    >>> SeedKey(0, step=3, first_episode=4).for_request(1, 1) == a
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SPLITS = {"train": 0, "eval": 1}


def sample_seed(
    seed: int, *, step: int, refill_round: int = 0, episode: int, turn: int, split: str = "train"
) -> int:
    """The 63-bit seed of the request that episode ``episode`` makes at turn ``turn``."""
    split_code = _SPLITS.get(split)
    if split_code is None:
        raise ValueError(f"unknown seed split {split!r}; expected one of {sorted(_SPLITS)}")
    entropy = [int(seed) & (2**63 - 1), split_code, step, refill_round, episode, turn]
    return int(np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class SeedKey:
    """The seeds of one rollout: env ``i`` of this process is episode ``first_episode + i * episode_stride``."""

    seed: int
    step: int = 0
    refill_round: int = 0
    first_episode: int = 0
    split: str = "train"
    episode_stride: int = 1  # eval deals prompts round-robin: env i is episode first + i * processes

    def for_request(self, env_index: int, turn: int) -> int:
        return sample_seed(
            self.seed,
            step=self.step,
            refill_round=self.refill_round,
            episode=self.first_episode + env_index * self.episode_stride,
            turn=turn,
            split=self.split,
        )


def batch_seed(seeds: tuple[int, ...] | list[int]) -> int:
    """One seed for a batch of requests with their own seeds (an engine that samples a batch from
    one random stream, as Hugging Face ``generate`` does)."""
    return int(
        np.random.SeedSequence([int(s) for s in seeds]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1)
    )
