"""What every update shares, SFT and GRPO alike: the state it changes and one optimizer step.

:class:`Learner` holds what an update needs (model, reference model, optimizer, LR schedule);
:func:`step_optimizer` runs ``gradient_accumulation_steps`` micro-batches through backward, clips
and steps; :func:`sync_weights` hands the new weights to a sampler that is not the trained module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlf_trainer.config import Config
from rlf_trainer.run.distributed import full_parameters


@dataclass
class Learner:
    """What an update changes: the trained model (prepared by Accelerate), the frozen reference
    model (None without a KL penalty, or under LoRA where the base with adapters off is the
    reference), the optimizer and the LR schedule."""

    config: Config
    accelerator: Any
    model: Any
    ref_model: Any | None
    optimizer: Any
    scheduler: Any


def step_optimizer(learner: Learner, micro_loss: Callable[[int], tuple[torch.Tensor, float]]) -> float | None:
    """One optimizer step over ``gradient_accumulation_steps`` micro-batches; the grad norm, if clipped.

    ``micro_loss(i)`` runs micro-batch ``i``'s forward pass and returns its loss and the step's
    denominator (the loss's normaliser counted over every micro-batch of every process, or 1.0
    when the loss is already divided by it). Accelerate divides each backward by the accumulation
    steps and DDP averages the gradients over processes; the denominator already counts both, so
    they are undone here and the gradient is exactly that of the whole step's loss.
    """
    acc, model = learner.accelerator, learner.model
    steps, max_norm = acc.gradient_accumulation_steps, learner.config.optim.max_grad_norm
    grad_norm: float | None = None
    for index in range(steps):
        with acc.accumulate(model):
            loss, denominator = micro_loss(index)
            acc.backward(loss * (steps * acc.num_processes / denominator))
            if acc.sync_gradients and max_norm > 0:
                norm_value = acc.clip_grad_norm_(model.parameters(), max_norm)
                grad_norm = float(norm_value) if norm_value is not None else None
            learner.optimizer.step()
            learner.optimizer.zero_grad(set_to_none=True)
    if not acc.sync_gradients:
        raise RuntimeError(
            "gradient accumulation went out of step with the micro-batches: an optimizer step must "
            "be exactly gradient_accumulation_steps micro-batches"
        )
    return grad_norm


def sync_weights(learner: Learner, policy: Any, *, version: int | None = None, force: bool = False) -> None:
    """Give a sampler that is not the trained module the current weights, as version ``version``.

    vLLM: every call. Remote servers: after every ``policy.remote.sync_every``-th version (never
    when it is 0), or whenever ``force`` (a run's start and a resume, so the servers serve exactly
    the trained weights). The HF policy samples with the model itself: nothing to do.
    """
    backend = learner.config.policy.backend
    if backend == "vllm":
        with full_parameters(learner.accelerator, learner.model):
            policy.update_weights(learner.accelerator.unwrap_model(learner.model))
    elif backend == "remote":
        every = learner.config.policy.remote.sync_every
        version = policy.version + 1 if version is None else version
        if every and (force or version % every == 0):
            push_to_servers(learner, policy, version)


def push_to_servers(learner: Learner, policy: Any, version: int) -> None:
    """The main process writes the weights and has the servers load them; the other processes
    (whose parameters a sharded model needs to gather) then ask the servers what they serve."""
    acc = learner.accelerator
    with full_parameters(acc, learner.model):
        if acc.is_main_process:
            policy.update_weights(acc.unwrap_model(learner.model), version=version)
    acc.wait_for_everyone()
    if not acc.is_main_process:
        policy.refresh_versions()


def samples_with_trained_model(learner: Learner, policy: Any) -> bool:
    """True when the policy generates with the very module being trained (the HF backend)."""
    return getattr(policy, "model", None) is learner.accelerator.unwrap_model(learner.model)


__all__ = ["Learner", "push_to_servers", "samples_with_trained_model", "step_optimizer", "sync_weights"]
