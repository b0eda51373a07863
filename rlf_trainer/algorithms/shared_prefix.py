"""A micro-batch's common prefix forwarded once: a GRPO group's prompt, an SFT batch's system prompt.

The rows of a GRPO group start with the same prompt (system message, tool list, question): ~330 of
the ~670 tokens of a DeepSearch episode. :func:`shared_prefix_hidden` runs the model once over the
prefix, keeping its keys and values (a ``DynamicCache``), repeats them for every row and runs the
rows' own tokens on top, in :func:`suffix_passes` that pad little: the same last hidden states as
one pass over the whole rows, up to rounding, with the gradient reaching the prefix's computation
through the cached keys and values.
:func:`micro_batch_rows` picks micro-batches that share prefixes when that forwards fewer tokens.

Why not packing a group into one row with a block mask: the CPU kernel computes every block of an
explicit mask, all ``(P + S_1 + ... + S_n)^2`` scores; here row ``i``'s tokens score ``S_i x (P + S_i)``.
Where it pays (on a CPU, with a group a micro-batch): ``optimize.shares_prefix``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from rlf_trainer.policy.prefix_cache import no_logits

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
    ``prefix`` tokens are forwarded once, the rows' own tokens in :func:`suffix_passes` (``prefix=0``:
    every row whole, padded to the widest).

    >>> forwarded_positions(torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]), 2)
    (6, 5)
    """
    rows, width = attention_mask.shape
    lengths = attention_mask.sum(dim=1).tolist()
    real = prefix + sum(length - prefix for length in lengths)
    if not prefix:
        return rows * width, real
    passes = suffix_passes(lengths, prefix)
    return prefix + sum(len(picked) * (lengths[picked[0]] - prefix) for picked in passes), real


def suffix_passes(lengths: Sequence[int], prefix: int) -> list[list[int]]:
    """The model calls that run the rows' own tokens after a shared ``prefix``: row indices, longest
    first, split where padding every row to its call's longest would run more positions than
    another call costs (``MIN_SHARED_TOKENS``). A group's episodes end after 1 to 4 turns: one call
    for all its rows ran half padding (a DeepSearch batch: 4,772 positions for 2,345 tokens).

    >>> suffix_passes([100, 98, 40, 97], prefix=30)
    [[0, 1, 3], [2]]
    >>> suffix_passes([100, 98], prefix=30)
    [[0, 1]]
    """
    order = sorted(range(len(lengths)), key=lambda row: -lengths[row])
    own = [lengths[row] - prefix for row in order]
    # cost[j]: the fewest positions (a call counted as MIN_SHARED_TOKENS) for the j longest rows
    cost, cut = [0] + [0] * len(own), [0] * (len(own) + 1)
    for j in range(1, len(own) + 1):
        cost[j], cut[j] = min((cost[i] + own[i] * (j - i) + MIN_SHARED_TOKENS, i) for i in range(j))
    passes, end = [], len(own)
    while end:
        passes.append(order[cut[end] : end])
        end = cut[end]
    return passes[::-1]


def shared_prefix_hidden(
    model: Any, decoder: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int
) -> tuple[torch.Tensor, Any]:
    """The decoder's last hidden states ``[n, T, H]`` of right-padded rows that share their first
    ``prefix`` tokens, the prefix forwarded once; also the prefix pass's output (its empty logits put
    the head in the graph; the other passes' would only add zero gradients of the head's size).
    ``model`` is the callable model (wrappers included), ``decoder`` its decoder module, whose
    output is captured. The rows' own tokens run in
    :func:`suffix_passes`, each on a copy of the prefix's keys and values per row. No attention
    mask: a real token never attends to the pads after it, and a suffix pass's causal mask is built
    from the cache's length. Pad positions' hidden states are zeros.
    """
    from transformers import DynamicCache

    rows, width = input_ids.shape
    lengths = attention_mask.sum(dim=1).tolist()
    prefix_cache = DynamicCache(config=decoder.config)
    none = no_logits(input_ids.device)
    with first_outputs(decoder) as captured:
        first = model(
            input_ids=input_ids[:1, :prefix],
            past_key_values=prefix_cache,
            use_cache=True,
            logits_to_keep=none,
        )
        pieces, order = [], []
        for picked in suffix_passes(lengths, prefix):
            own = lengths[picked[0]] - prefix
            cache = DynamicCache(config=decoder.config)
            for index, layer in enumerate(prefix_cache.layers):  # differentiable back to the one prefix
                size = (len(picked), -1, -1, -1)
                cache.update(layer.keys.expand(size), layer.values.expand(size), index)
            ids = input_ids[picked, prefix : prefix + own]
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=none)
            pieces.append(torch.nn.functional.pad(captured[-1], (0, 0, 0, width - prefix - own)))
            order.extend(picked)
    suffix = torch.cat(pieces)[torch.as_tensor(order, device=input_ids.device).argsort()]
    return torch.cat([captured[0].expand(rows, -1, -1), suffix], dim=1), first


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
    "no_logits",
    "shared_prefix_hidden",
    "suffix_passes",
]
