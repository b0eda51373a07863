"""The learning-rate schedule: ``optim.schedule`` as a ``transformers.get_scheduler`` schedule.

Linear warmup from 0 over ``optim.warmup_steps``, then ``constant``, ``linear`` or ``cosine`` decay
to ``optim.min_lr_ratio`` x ``optim.lr`` at ``total_steps``. Each kind maps onto one of
transformers' schedules with the same per-step values:

=========  =============================================================================
constant   ``constant_with_warmup`` (also any kind with ``min_lr_ratio`` 1)
linear     ``linear`` (``min_lr_ratio`` 0) or ``polynomial`` with power 1 and
           ``lr_end = min_lr_ratio * lr``
cosine     ``cosine_with_min_lr`` with ``min_lr_rate = min_lr_ratio``
=========  =============================================================================

Example:
    >>> import torch
    >>> from rlf_trainer.config_sections import OptimConfig
    >>> optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    >>> scheduler = lr_scheduler(optimizer, OptimConfig(lr=1.0, schedule="linear", warmup_steps=2), 6)
    >>> rates = []
    >>> for _ in range(7):
    ...     rates.append(round(scheduler.get_last_lr()[0], 2))
    ...     optimizer.step()
    ...     scheduler.step()
    >>> rates
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0]
"""

from __future__ import annotations

from typing import Any

import torch

from rlf_trainer.config_sections import OptimConfig


def lr_scheduler(optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int) -> Any:
    """The ``LambdaLR`` for ``optim.schedule`` over ``total_steps`` trainer steps: the trainer steps it
    once per GRPO or SFT step, whatever the number of optimizer steps (``algorithm.mini_batches`` x
    ``algorithm.num_iterations``) inside one."""
    from transformers import get_scheduler

    warmup = optim.warmup_steps
    if optim.schedule == "constant" or optim.min_lr_ratio == 1:  # nothing to decay to
        return get_scheduler("constant_with_warmup", optimizer, num_warmup_steps=warmup)
    if optim.schedule == "cosine":
        return get_scheduler(
            "cosine_with_min_lr",
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=total_steps,
            scheduler_specific_kwargs={"min_lr_rate": optim.min_lr_ratio},
        )
    if optim.min_lr_ratio == 0:
        return get_scheduler("linear", optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
    # polynomial divides by (total - warmup) unguarded: a run that never leaves warmup decays nowhere.
    return get_scheduler(
        "polynomial",
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=max(total_steps, warmup + 1),
        scheduler_specific_kwargs={"lr_end": optim.min_lr_ratio * optim.lr, "power": 1.0},
    )
