"""Grouped-query attention with a mask on a CPU, without copying each key/value head per query head.

transformers' ``sdpa`` attention passes ``enable_gqa=True`` to ``scaled_dot_product_attention``
only when no mask is given (CUDA's flash kernels take one or the other); with a mask it first
repeats every key/value head once per query head it serves (``repeat_kv``), a copy of the whole
key/value cache in every layer. A rollout's batches nearly always carry a mask (left padding, and
the prefix cache's ``[pad][stored][pad][new]`` rows), so nearly every decoding step paid that copy:
for SmolLM2-135M (9 query heads over 3 key/value heads), 16 rows over 700 tokens, bf16, one
thread, a decoding forward took 210 ms with left padding, 120 ms with it through this module and
118-120 ms without padding (docs/benchmarks.md). torch's CPU flash kernel takes a mask and grouped
heads together, with outputs equal to the repeated heads' to the last bit.

:func:`use_grouped_sdpa` switches a model to :func:`grouped_sdpa_forward`, registered with
transformers' ``AttentionInterface`` (and ``sdpa``'s masks) under :data:`GROUPED_SDPA`. It passes a
CPU call with a mask and grouped heads straight to the kernel with ``enable_gqa=True`` and leaves
every other call (no mask, other devices, paged caches, position biases) to transformers' ``sdpa``.
A masked call that needs gradients and would run in bf16 runs the kernel in fp32
(:func:`trains_in_fp32`): the CPU flash kernel's masked backward is slower in bf16.
The name lives only in the running model's config: a saved folder records no attention
implementation, so vLLM, rlf-serve and ``from_pretrained`` load it as before.

Example (a tiny random Llama with 4 query heads over 2 key/value heads):
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> ids, mask = torch.tensor([[0, 5, 6, 7], [4, 5, 6, 7]]), torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    >>> before = model(input_ids=ids, attention_mask=mask).logits
    >>> use_grouped_sdpa(model), model.config._attn_implementation
    (True, 'rlf_grouped_sdpa')
    >>> torch.equal(model(input_ids=ids, attention_mask=mask).logits, before)
    True
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

GROUPED_SDPA = "rlf_grouped_sdpa"


def grouped_sdpa_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[batch, heads, q, dim]``, ``key`` and
    ``value`` ``[batch, kv_heads, k, dim]``; returns ``[batch, q, heads, dim]`` and no weights."""
    grouped = getattr(module, "num_key_value_groups", 1) > 1
    plain = kwargs.get("position_bias") is not None or kwargs.get("cache") is not None
    if attention_mask is None or not grouped or plain or query.device.type != "cpu":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    # With a mask transformers' sdpa is never causal: the mask says it all.
    fp32 = trains_in_fp32(query)
    with torch.autocast("cpu", enabled=False) if fp32 else nullcontext():
        operands = (query.float(), key.float(), value.float()) if fp32 else (query, key, value)
        out = torch.nn.functional.scaled_dot_product_attention(
            *operands, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
    return (out.to(query.dtype) if fp32 else out).transpose(1, 2).contiguous(), None


def trains_in_fp32(query: torch.Tensor) -> bool:
    """Whether a masked CPU attention call runs its kernel in fp32 (autocast off, the output back in
    the query's dtype): in a pass that needs gradients and would run in bf16 (bf16 operands or bf16
    autocast). Why: torch's CPU flash kernel's backward with a mask is slower in bf16 than in fp32
    (the recipe's GRPO update, one batch, same process: 2.5-4.2 s of 33-35 s less in fp32;
    docs/benchmarks.md), while its forward is faster in bf16, so sampling and the reference
    model's pass keep bf16.
    """
    autocast_bf16 = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    lower = query.dtype == torch.bfloat16 or (autocast_bf16 and query.dtype == torch.float32)
    return torch.is_grad_enabled() and query.requires_grad and lower


def register_grouped_sdpa() -> None:
    """Make :data:`GROUPED_SDPA` a valid ``attn_implementation``, with ``sdpa``'s mask format."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_sdpa(model: Any) -> bool:
    """Switch a transformers model, as loaded (before any LoRA or DDP wrapper), from ``sdpa`` to
    :func:`grouped_sdpa_forward` where its attention groups query heads; True if it switched.

    Models on another attention implementation (eager, flash, flex) or without grouped heads are
    left as they are. The outputs are unchanged; only the copies go.
    """
    config = getattr(model, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text_config, "num_attention_heads", None)
    kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
    if getattr(config, "_attn_implementation", None) != "sdpa" or not heads or kv_heads >= heads:
        return False
    register_grouped_sdpa()
    model.set_attn_implementation(GROUPED_SDPA)
    return True


__all__ = [
    "GROUPED_SDPA",
    "grouped_sdpa_forward",
    "register_grouped_sdpa",
    "trains_in_fp32",
    "use_grouped_sdpa",
]
