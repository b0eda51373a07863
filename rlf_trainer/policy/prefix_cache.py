"""PrefixKVStore: key/value states of sequences already generated, so the next turn prefills only its new tokens.

Why: ``model.generate`` re-reads the whole conversation on every turn. In a 4-turn DeepSearch
episode most of a CPU rollout went into re-reading prompts it had read the turn before. vLLM solves
this with automatic prefix caching; this is the same idea for the HF policy: after each call the
store keeps every row's states (prompt + completion), and a later prompt that extends a stored
sequence starts from it. Rows of a new batch that share a long common prefix (the system prompt and
tool schemas, a GRPO group's question) have it computed once.

Layout of a batch that starts from stored states: every row is ``[pad][stored][pad][new]``, pads
masked. transformers numbers positions by counting unmasked tokens, so each token keeps the position
its stored states were computed at, and the result is the unpadded computation's (up to float
rounding). Only models whose cache layers are all full attention qualify (a sliding window counts
columns, pads included); others generate without the store.

Stored states belong to one set of weights: the store empties itself when any parameter's version
counter moved (every in-place update, the optimizer's included) or when :meth:`clear` is called.

Example (a tiny random model: the second call reuses the first call's prompt and completion):
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> store = PrefixKVStore(model, max_tokens=1024)
    >>> store.add([1, 2, 3, 4], [(torch.zeros(2, 4, 8), torch.zeros(2, 4, 8))] * 2)
    >>> [match.length for match in store.lookup([[1, 2, 3, 4, 5, 6], [9, 9]])]
    [4, 0]
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

# per layer: keys, values of shape (heads, tokens, head_dim)
LayerStates = list[tuple[torch.Tensor, torch.Tensor]]
MIN_SHARED_PREFIX = 32  # shorter common prefixes are not worth a separate forward pass


@dataclass
class PrefixMatch:
    """The stored states a prompt starts from: its first ``length`` tokens (0: none)."""

    length: int = 0
    states: LayerStates | None = None
    key: tuple[int, ...] = ()


@dataclass
class PrefixBatch:
    """``generate`` inputs for prompts laid out as ``[pad][stored][pad][new]``; ``past`` the cache to
    decode into (the rows' stored states, with room for the new tokens), None where the model's
    config describes no cache."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    past: Any
    matches: list[PrefixMatch]


class PrefixKVStore:
    """Least-recently-used key/value states of token sequences, at most ``max_tokens`` tokens in all.

    ``reused_tokens`` and ``prefilled_tokens`` count, over the store's life, the prompt tokens that
    started from stored states and those computed afresh.
    """

    def __init__(self, model: Any, max_tokens: int) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], LayerStates] = OrderedDict()
        self._stored_tokens = 0
        self._weights_version = _weights_version(model)
        self.reused_tokens = 0
        self.prefilled_tokens = 0

    # -------------------------------------------------------------------------------- entries
    def clear(self) -> None:
        """Forget every stored sequence (their weights are gone)."""
        self._entries.clear()
        self._stored_tokens = 0

    def add(self, tokens: list[int], states: LayerStates) -> None:
        """Store ``states`` for ``tokens``, evicting the least recently used beyond ``max_tokens``."""
        key = tuple(tokens)
        if not key or len(key) > self.max_tokens:
            return
        if key in self._entries:
            self._discard(key)
        self._entries[key] = states
        self._stored_tokens += len(key)
        while self._stored_tokens > self.max_tokens:
            self._discard(next(iter(self._entries)))

    def _discard(self, key: tuple[int, ...]) -> None:
        if self._entries.pop(key, None) is not None:
            self._stored_tokens -= len(key)

    def _longest(self, prompt: list[int]) -> PrefixMatch:
        best = PrefixMatch()
        for key, states in self._entries.items():
            # At least one prompt token must stay new: generate needs the last position's logits.
            if best.length < len(key) < len(prompt) and tuple(prompt[: len(key)]) == key:
                best = PrefixMatch(len(key), states, key)
        if best.key:
            self._entries.move_to_end(best.key)
        return best

    # -------------------------------------------------------------------------------- per call
    def lookup(self, prompts: list[list[int]]) -> list[PrefixMatch]:
        """Each prompt's longest stored prefix; prompts without one share their common prefix if it is long."""
        self._drop_if_weights_changed()
        matches = [self._longest(prompt) for prompt in prompts]
        fresh = [row for row, match in enumerate(matches) if match.length == 0]
        shared = _common_prefix([prompts[row] for row in fresh]) if len(fresh) > 1 else []
        shared = shared[: min(len(prompts[row]) for row in fresh) - 1] if shared else []
        if len(shared) >= MIN_SHARED_PREFIX:
            states = self._forward(shared)
            self.add(shared, states)
            for row in fresh:
                matches[row] = PrefixMatch(len(shared), states, tuple(shared))
        self.reused_tokens += sum(match.length for match in matches)
        self.prefilled_tokens += sum(len(p) - m.length for p, m in zip(prompts, matches, strict=True))
        return matches

    def remember(
        self, batch: PrefixBatch, prompts: list[list[int]], completions: list[list[int]], past: Any
    ) -> None:
        """Store each row's prompt + completion (bar its last token, never fed back) from ``generate``'s cache.

        The sequences the rows started from are dropped: their continuations hold them.
        """
        for match in batch.matches:
            self._discard(match.key)
        width = batch.attention_mask.shape[1]
        layers = [(layer.keys, layer.values) for layer in past.layers]
        for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            if not completion:
                continue
            prompt_columns = batch.attention_mask[row].nonzero().squeeze(1)
            generated = torch.arange(width, width + len(completion) - 1, device=prompt_columns.device)
            columns = torch.cat([prompt_columns, generated])
            states = [(k[row].index_select(1, columns), v[row].index_select(1, columns)) for k, v in layers]
            self.add(prompt + completion[:-1], states)

    def _forward(self, tokens: list[int]) -> LayerStates:
        with torch.no_grad():
            device = _device(self.model)
            # only the key/value states are kept
            ids = torch.tensor([tokens], device=device)
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=no_logits(device))
        return [(layer.keys[0], layer.values[0]) for layer in out.past_key_values.layers]

    def _drop_if_weights_changed(self) -> None:
        version = _weights_version(self.model)
        if version != self._weights_version:
            self.clear()
            self._weights_version = version


def no_logits(device: torch.device | str) -> torch.Tensor:
    """``logits_to_keep`` for a pass that needs the decoder's hidden states and no logits: no
    position's (HF models index the hidden states with it). The empty logits still put the head
    in the graph, for DDP. ``logits_to_keep=1`` projected a non-contiguous slice of the hidden
    states, for which matmul copied the head to ``[rows, H, V]``: 0.7 s of copies in a 20 s bf16
    update of the DeepSearch recipe; the store's forward of a shared prompt keeps
    only its key/value states.

    >>> no_logits("cpu").shape
    torch.Size([0])
    """
    return torch.empty(0, dtype=torch.long, device=device)


def supports_prefix_cache(model: Any) -> bool:
    """True when every cache layer of ``model`` is full attention with a growing (dynamic) cache."""
    from rlf_trainer.policy.growing_cache import full_attention_cache

    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    return full_attention_cache(config) is not None


def build_prefix_batch(
    prompts: list[list[int]],
    matches: list[PrefixMatch],
    pad_id: int,
    device: torch.device,
    config: Any,
    new_tokens: int = 0,
) -> PrefixBatch:
    """Lay ``prompts`` out as ``[pad][stored][pad][new]`` and stack the stored states into one cache
    with room for ``new_tokens`` more (:func:`~rlf_trainer.policy.growing_cache.growing_cache`)."""
    from rlf_trainer.policy.growing_cache import growing_cache

    stored_width = max(match.length for match in matches)
    new_width = max(len(prompt) - match.length for prompt, match in zip(prompts, matches, strict=True))
    rows = len(prompts)
    input_ids = torch.full((rows, stored_width + new_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt, match) in enumerate(zip(prompts, matches, strict=True)):
        stored, new = prompt[: match.length], prompt[match.length :]
        input_ids[row, stored_width - len(stored) : stored_width] = torch.tensor(stored, dtype=torch.long)
        attention_mask[row, stored_width - len(stored) : stored_width] = 1
        input_ids[row, input_ids.shape[1] - len(new) :] = torch.tensor(new, dtype=torch.long)
        attention_mask[row, input_ids.shape[1] - len(new) :] = 1
    layers = []
    if stored_width:
        template = next(match.states for match in matches if match.states is not None)
        for layer, (keys, values) in enumerate(template):
            k = keys.new_zeros((rows, keys.shape[0], stored_width, keys.shape[2]))
            v = values.new_zeros((rows, values.shape[0], stored_width, values.shape[2]))
            for row, match in enumerate(matches):
                if match.states is not None:
                    k[row, :, stored_width - match.length :] = match.states[layer][0]
                    v[row, :, stored_width - match.length :] = match.states[layer][1]
            layers.append((k, v))
    past = growing_cache(config, input_ids.shape[1] + new_tokens, layers)
    return PrefixBatch(input_ids.to(device), attention_mask.to(device), past, matches)


def _common_prefix(sequences: list[list[int]]) -> list[int]:
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for end in range(length):
        if any(s[end] != first[end] for s in sequences[1:]):
            return first[:end]
    return first[:length]


def _weights_version(model: Any) -> int:
    """Moves with every in-place change of any parameter (optimizer steps, ``load_state_dict``)."""
    return sum(p._version for p in model.parameters())


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device
