"""Stochastic rounding of the fp32 master weights that bf16 autocast casts, after each optimizer step.

Why: under bf16 compute the model that samples and the one whose gradients are taken see the
fp32 master weights rounded to bf16 (the sampling copy, and autocast at every forward). A model
published in bf16 (SmolLM2, Qwen) has master weights that are bf16 values already, so an update
smaller than half a bf16 spacing rounds back to the same weights and is invisible: SmolLM2-135M's
median spacing is 4.9e-4, and a sign step of 2e-5 (AdamW's first step at lr 2e-5) moved the bf16
model's log-prob of the pushed sequence by 1.25 nats where the fp32 model moved by 16.8. Rounding
the master weights up or down with probability given by the distance keeps every update unbiased
(the same step moved the stochastically rounded model by 16.8-17.2 nats) and leaves the sampler
and the trainer on the same weights. This is the bf16 training of Zamirai et al., "Revisiting
BFloat16 Training" (2020); the AdamW moments stay fp32.

Example:
    >>> import torch
    >>> w = torch.full((100_000,), 1.0 + 2**-10)  # 1/8 of the way from 1.0 to the next bf16 value
    >>> stochastic_round_to_bf16_(w, torch.Generator().manual_seed(0))
    >>> sorted(set(w.tolist())), round(w.mean().item(), 4)
    ([1.0, 1.0078125], 1.001)
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

_LOW_BITS = 1 << 16  # the fp32 mantissa bits that bf16 drops


def stochastic_round_to_bf16_(tensor: torch.Tensor, generator: torch.Generator) -> None:
    """Round an fp32 ``tensor`` in place to bf16 values: up with probability (distance to the lower
    bf16 value) / spacing, so ``E[result] = tensor``. Values that are bf16 already stay as they are."""
    if tensor.dtype != torch.float32:
        raise TypeError(f"stochastic rounding to bf16 takes fp32 master weights, got {tensor.dtype}")
    bits = tensor.view(torch.int32)
    noise = torch.randint(
        0, _LOW_BITS, tensor.shape, generator=generator, dtype=torch.int32, device=tensor.device
    )
    # adding a uniform 16-bit integer to the magnitude bits carries into the kept bits with
    # probability equal to the dropped fraction; the sign bit is untouched
    bits.add_(noise).bitwise_and_(~(_LOW_BITS - 1))


def round_master_weights_(parameters: Iterable[torch.nn.Parameter], seed: int, step: int) -> None:
    """Stochastically round every trained fp32 parameter after optimizer step ``step``.

    The noise comes from ``(seed, step)`` alone, so every data-parallel process rounds its
    identical replica identically and a resumed run repeats the rounding of the run it resumes.
    """
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for param in parameters:
            if not param.requires_grad or param.dtype != torch.float32:
                continue
            generator = generators.get(param.device)
            if generator is None:
                generator = torch.Generator(device=param.device).manual_seed(seed * 1_000_003 + step)
                generators[param.device] = generator
            stochastic_round_to_bf16_(param.data, generator)


def autocast_matmul_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """What bf16 autocast casts at every forward of ``model`` (DDP- or PEFT-wrapped alike): the
    ``nn.Linear`` weights and biases, save the output projection.

    Only these are rounded: the update uses the rest in fp32 (norm weights multiply the fp32
    residual stream, the embedding lookup is not autocast, and the output projection runs in
    fp32 in :func:`~rlf_trainer.algorithms.head_logprobs.chunked_selective_log_softmax`), so rounding them
    would add noise the update never sees; a norm weight near 1.0 has a bf16 spacing of 0.0078,
    some 400 AdamW steps at lr 2e-5.
    """
    core = getattr(model, "module", model)
    get_head = getattr(core, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    found: list[torch.nn.Parameter] = []
    for module in core.modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            found += [param for param in (module.weight, module.bias) if param is not None]
    return found


def is_bf16_valued(tensor: torch.Tensor) -> bool:
    """Whether every value of ``tensor`` is exactly representable in bf16."""
    return bool(torch.equal(tensor, tensor.to(torch.bfloat16).to(tensor.dtype)))


__all__ = [
    "autocast_matmul_parameters",
    "is_bf16_valued",
    "round_master_weights_",
    "stochastic_round_to_bf16_",
]
