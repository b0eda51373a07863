"""Which train prompts a step uses: :class:`PromptSampler`, a pure function of ``(seed, step)``.

Example:
    >>> sampler = PromptSampler(num_tasks=5, seed=0)
    >>> sampler.indices(step=3, count=2) == PromptSampler(num_tasks=5, seed=0).indices(step=3, count=2)
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_UNKNOWN_SIZE = 2**31 - 1  # the env wraps an index around its split's size
_REFILL_STREAM = 0x5EF111


@dataclass(frozen=True)
class PromptSampler:
    """Which train prompts step ``k`` uses: epoch-wise shuffled when ``num_tasks`` is known.

    The stream is a pure function of ``seed``: position ``p`` (the ``p``-th prompt drawn in the run)
    is element ``p % num_tasks`` of the permutation of epoch ``p // num_tasks``. With an unknown
    size, prompts are drawn with replacement from a large range (the env wraps it to its split).
    """

    num_tasks: int | None
    seed: int

    def at(self, position: int) -> int:
        if self.num_tasks is None:
            return int(np.random.default_rng([self.seed, position]).integers(_UNKNOWN_SIZE))
        epoch, offset = divmod(position, self.num_tasks)
        return int(np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)[offset])

    def indices(self, step: int, count: int) -> list[int]:
        """The ``count`` prompt indices of 0-based step ``step`` (positions ``step*count ...``)."""
        start = step * count
        if self.num_tasks is None:
            return [self.at(p) for p in range(start, start + count)]
        out: list[int] = []
        position = start
        while len(out) < count:  # one permutation per epoch touched, not one per prompt
            epoch, offset = divmod(position, self.num_tasks)
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)
            take = min(count - len(out), self.num_tasks - offset)
            out.extend(int(i) for i in perm[offset : offset + take])
            position += take
        return out

    def refill_indices(self, step: int, round_: int, count: int) -> list[int]:
        """Extra prompts for DAPO's refill round ``round_`` (1, 2, ...) of step ``step``.

        A stream of its own, a pure function of ``(seed, step, round_)``: however many rounds a
        step needed, the main stream (and so :meth:`state`) is the same, and a resumed run refills
        a step exactly as the original run did.

        Example:
            >>> s = PromptSampler(num_tasks=10, seed=0)
            >>> s.refill_indices(3, 1, 4) == s.refill_indices(3, 1, 4) != s.refill_indices(3, 2, 4)
            True
        """
        stream_seed = np.random.SeedSequence([self.seed, step, _REFILL_STREAM, round_]).generate_state(
            2, dtype=np.uint64
        )[0]
        stream = PromptSampler(self.num_tasks, int(stream_seed >> np.uint64(1)))
        return stream.indices(0, count)

    def state(self, step: int, count: int) -> dict[str, Any]:
        """The JSON-friendly data position after ``step`` steps of ``count`` prompts."""
        position = step * count
        epoch = None if self.num_tasks is None else position // self.num_tasks
        return {"seed": self.seed, "num_tasks": self.num_tasks, "position": position, "epoch": epoch}
