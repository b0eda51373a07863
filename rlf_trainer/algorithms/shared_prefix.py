"""A micro-batch's common prefix forwarded once: a GRPO group's prompt, an SFT batch's system prompt.

The rows of a GRPO group start with the same prompt (system message, tool list, question): ~330 of
the ~670 tokens of a DeepSearch episode. :func:`shared_prefix_hidden` runs the model once over the
prefix, keeping its keys and values (a ``DynamicCache``), repeats them for every row and runs the
rows' own tokens on top: the same last hidden states as one pass over the whole rows, up to
rounding, with the gradient reaching the prefix's computation through the cached keys and values.
:func:`micro_batch_rows` picks micro-batches that share prefixes when that forwards fewer tokens.

Why not packing a group into one row with a block mask: the CPU kernel computes every block of an
explicit mask, all ``(P + S_1 + ... + S_n)^2`` scores; here row ``i``'s tokens score ``S_i x (P + S_i)``.
Where it pays (fp32 on a CPU, not bf16): ``optimize.shares_prefix``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

# below this a second model call costs more than the tokens it saves
MIN_SHARED_TOKENS = 16


def common_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """How many leading tokens every row of a right-padded batch has in common, leaving each row
    at least one token of its own (the suffix pass needs one); 0 for a single row.

    >>> ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0]])
    >>> common_prefix_length(ids, torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]))
    2
    >>> common_prefix_length(ids[:, :2], torch.ones(2, 2, dtype=torch.long))  # identical rows
    1
    """
    if input_ids.shape[0] < 2:
        return 0
    shortest = int(attention_mask.sum(dim=1).min())
    same = (input_ids[:, :shortest] == input_ids[:1, :shortest]).all(dim=0)
    differs = torch.nonzero(~same)
    common = int(differs[0, 0]) if len(differs) else shortest
    return max(0, min(common, shortest - 1))


def forwarded_positions(attention_mask: torch.Tensor, prefix: int) -> tuple[int, int]:
    """``(positions run, real tokens among them)`` for a right-padded micro-batch whose first
    ``prefix`` tokens are forwarded once (``prefix=0``: every row whole, padded to the widest).

    >>> forwarded_positions(torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]), 2)
    (6, 5)
    """
    rows, width = attention_mask.shape
    lengths = attention_mask.sum(dim=1)
    return prefix + rows * (width - prefix), prefix + int((lengths - prefix).sum())


def shared_prefix_hidden(
    model: Any, decoder: Any, input_ids: torch.Tensor, prefix: int
) -> tuple[torch.Tensor, list]:
    """The decoder's last hidden states ``[n, T, H]`` of right-padded rows that share their first
    ``prefix`` tokens, the prefix forwarded once; also the two passes' outputs (their logits keep
    every parameter in the graph). ``model`` is the callable model (wrappers included), ``decoder``
    its decoder module, whose output is captured. No attention mask: a real token never attends
    to the pads after it, and the suffix pass's causal mask is built from the cache's length.
    """
    from transformers import DynamicCache

    rows = input_ids.shape[0]
    cache = DynamicCache(config=decoder.config)
    with first_outputs(decoder) as captured:
        head = model(
            input_ids=input_ids[:1, :prefix], past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        cache.batch_repeat_interleave(rows)  # a copy per row, differentiable back to the one prefix
        tail = model(input_ids=input_ids[:, prefix:], past_key_values=cache, use_cache=True, logits_to_keep=1)
    hidden = torch.cat([captured[0].expand(rows, -1, -1), captured[1]], dim=1)
    return hidden, [head, tail]


@contextmanager
def first_outputs(module: Any) -> Iterator[list[torch.Tensor]]:
    """Within the block, the first output of every call of ``module`` (a decoder's last hidden
    states), appended to the yielded list by a forward hook that is removed on exit."""
    captured: list[torch.Tensor] = []
    hook = module.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
    try:
        yield captured
    finally:
        hook.remove()


def micro_batch_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: np.ndarray,
    parts: int,
    groups: Sequence[int] | None = None,
) -> list[np.ndarray]:
    """``rows`` in ``parts`` micro-batches: longest first, so each trimmed to its longest row pads
    little; with ``groups`` (a key per row of the batch: rows of a group share their prompt), the
    rows of a group together, longest first within it, when that forwards fewer positions with
    the common prefix run once (:func:`forwarded_positions`).

    >>> ids = torch.tensor([[1] * 20 + [2, 3], [1] * 20 + [4, 0], [7] * 20 + [5, 6], [7] * 20 + [8, 0]])
    >>> mask = (torch.arange(22) < torch.tensor([[22], [21], [22], [21]])).long()
    >>> [r.tolist() for r in micro_batch_rows(ids, mask, np.arange(4), 2)]
    [[0, 2], [1, 3]]
    >>> [r.tolist() for r in micro_batch_rows(ids, mask, np.arange(4), 2, groups=[0, 0, 1, 1])]
    [[0, 1], [2, 3]]
    """
    picked = torch.as_tensor(rows, dtype=torch.long)
    lengths = attention_mask[picked].sum(dim=1).numpy()
    by_length = np.array_split(rows[np.argsort(-lengths, kind="stable")], parts)
    if groups is None:
        return by_length
    first_seen: dict[int, int] = {}
    for row in rows.tolist():
        first_seen.setdefault(groups[row], len(first_seen))
    keys = [
        (first_seen[groups[row]], -int(length)) for row, length in zip(rows.tolist(), lengths, strict=True)
    ]
    order = sorted(range(len(rows)), key=keys.__getitem__)
    by_group = np.array_split(rows[np.array(order, dtype=np.int64)], parts)
    if _positions(input_ids, attention_mask, by_group) < _positions(input_ids, attention_mask, by_length):
        return by_group
    return by_length


def _positions(input_ids: torch.Tensor, attention_mask: torch.Tensor, split: list[np.ndarray]) -> int:
    """Positions forwarded by ``split``'s micro-batches, each trimmed to its longest row."""
    total = 0
    for part in split:
        if not len(part):
            continue
        index = torch.as_tensor(part, dtype=torch.long)
        width = int(attention_mask[index].sum(dim=1).max())
        ids, mask = input_ids[index, :width], attention_mask[index, :width]
        prefix = common_prefix_length(ids, mask)
        total += forwarded_positions(mask, prefix if prefix >= MIN_SHARED_TOKENS else 0)[0]
    return total


__all__ = [
    "MIN_SHARED_TOKENS",
    "common_prefix_length",
    "first_outputs",
    "forwarded_positions",
    "micro_batch_rows",
    "shared_prefix_hidden",
]
