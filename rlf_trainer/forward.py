"""The forward passes a GRPO step makes besides its loss: the model's token log-probs, the
reference model's, the entropy of the trained positions, and sharded parameters gathered whole."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from rlf_trainer.collect import StepParts
from rlf_trainer.losses import selective_log_softmax, token_entropy
from rlf_trainer.rollout_batch import RolloutBatch

_ENTROPY_CHUNK = 1024  # token rows per entropy chunk: bounds the [rows, vocab] softmax


def token_logprobs(parts: StepParts, micro: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits ``[n, T-1, V]`` and log-probs ``[n, T-1]`` of the tokens of ``micro``."""
    logits = parts.model(
        input_ids=micro.input_ids, attention_mask=micro.attention_mask, use_cache=False
    ).logits[:, :-1]
    # Temperature 1: the policy records raw logprobs, whatever temperature it sampled with.
    return logits, selective_log_softmax(logits, micro.input_ids[:, 1:])


def reference_logprobs(parts: StepParts, micro: RolloutBatch) -> torch.Tensor:
    """Token log-probs of the reference model: a frozen copy, or the LoRA base with adapters off."""
    inputs = {"input_ids": micro.input_ids, "attention_mask": micro.attention_mask, "use_cache": False}
    with torch.no_grad():
        if parts.ref_model is not None:
            logits = parts.ref_model(**inputs).logits
        else:
            with parts.accelerator.unwrap_model(parts.model).disable_adapter():
                logits = parts.model(**inputs).logits
        return selective_log_softmax(logits[:, :-1], micro.input_ids[:, 1:])


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> float:
    rows = logits[mask.bool()]
    if rows.shape[0] == 0:
        return 0.0
    total = sum(
        float(token_entropy(rows[i : i + _ENTROPY_CHUNK]).sum())
        for i in range(0, rows.shape[0], _ENTROPY_CHUNK)
    )
    return total / rows.shape[0]


@contextlib.contextmanager
def full_parameters(accelerator: Any, model: Any) -> Iterator[None]:
    """Sharded (ZeRO-3 / FSDP) parameters gathered for the duration; a no-op otherwise."""
    kind = accelerator.distributed_type.value
    if kind == "DEEPSPEED" and accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            yield
    elif kind == "FSDP":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(model, writeback=False):
            yield
    else:
        yield
