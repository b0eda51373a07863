"""A text space for LLM envs: any unicode string up to a maximum length.

Gymnasium's ``spaces.Text`` only admits characters from a fixed charset (by default not even a
space), so model text with punctuation, newlines or non-Latin scripts would fall outside it.

Example:
    >>> space = UnicodeText(max_length=100)
    >>> "Héllo, wörld!\\n<tool_call>{}</tool_call>" in space
    True
"""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium import spaces

# What sample() draws from: printable ASCII plus a few non-ASCII letters and symbols.
_SAMPLE_CHARSET = string.printable + "éüßøçñ—“”…→中文日本語한국어Ωπ∑"


class UnicodeText(spaces.Text):
    """A ``spaces.Text`` whose ``contains`` accepts every ``str`` of length <= ``max_length``."""

    def __init__(self, max_length: int = 1_000_000, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string of printable and non-ASCII characters, at most 64 long."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        length = int(self.np_random.integers(self.min_length, min(self.max_length, 64) + 1))
        chars = self.np_random.choice(np.array(list(_SAMPLE_CHARSET)), size=length)
        return "".join(chars.tolist())

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    __hash__ = None  # type: ignore[assignment]
