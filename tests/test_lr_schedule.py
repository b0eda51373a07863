"""rlf_trainer.run.schedule: transformers' schedulers give the learning rates the hand-written LRSchedule gave.

The expected rates were computed with ``rlf_trainer.trainer.LRSchedule`` (commit b2d3acf, removed
when the schedule moved onto ``transformers.get_scheduler``): step k's rate is ``lr * factor[k]``.
"""

from __future__ import annotations

import pytest
import torch

from rlf_trainer.config_sections import OptimConfig
from rlf_trainer.run.schedule import lr_scheduler

# (schedule, warmup_steps, total_steps, min_lr_ratio) -> LRSchedule(...)(step) for step 0..total
BEFORE = {
    ("constant", 2, 6, 0.0): [0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0],
    ("constant", 0, 4, 0.0): [1.0, 1.0, 1.0, 1.0, 1.0],
    ("linear", 2, 6, 0.0): [0.0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0],
    ("linear", 2, 6, 0.1): [0.0, 0.5, 1.0, 0.775, 0.55, 0.325, 0.1],
    ("linear", 0, 4, 0.25): [1.0, 0.8125, 0.625, 0.4375, 0.25],
    ("linear", 3, 3, 0.5): [0.0, 0.3333333333333333, 0.6666666666666666, 1.0],
    ("linear", 1, 3, 1.0): [0.0, 1.0, 1.0, 1.0],
    ("cosine", 2, 6, 0.0): [0.0, 0.5, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0],
    ("cosine", 1, 5, 0.2): [0.0, 1.0, 0.882842712474619, 0.6000000000000001, 0.317157287525381, 0.2],
    ("cosine", 0, 4, 0.0): [1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0],
    ("cosine", 1, 5, 0.1): [0.0, 1.0, 0.8681980515339464, 0.55, 0.23180194846605365, 0.1],
}


def rates(schedule: str, warmup: int, total: int, min_ratio: float, lr: float) -> list[float]:
    """The learning rate each optimizer step 0..total runs with, as the trainer steps the scheduler."""
    param = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([param], lr=lr)
    optim = OptimConfig(lr=lr, schedule=schedule, warmup_steps=warmup, min_lr_ratio=min_ratio)
    scheduler = lr_scheduler(optimizer, optim, total_steps=total)
    seen = []
    for _ in range(total + 1):
        seen.append(optimizer.param_groups[0]["lr"])
        param.grad = torch.ones(1)
        optimizer.step()
        scheduler.step()
    return seen


@pytest.mark.parametrize("case", list(BEFORE), ids=lambda case: "-".join(map(str, case)))
def test_each_kind_gives_the_rates_of_the_hand_written_schedule(case):
    lr = 1e-3
    assert rates(*case, lr=lr) == pytest.approx([lr * f for f in BEFORE[case]], rel=1e-12, abs=1e-18)


def test_scheduler_state_round_trips_for_resume():
    """A checkpoint saves the scheduler; a fresh one loaded from it continues at the same rate."""
    param = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([param], lr=1.0)
    optim = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=1, min_lr_ratio=0.1)
    first = lr_scheduler(optimizer, optim, total_steps=5)
    for _ in range(3):
        optimizer.step()
        first.step()
    second = lr_scheduler(torch.optim.AdamW([param], lr=1.0), optim, total_steps=5)
    second.load_state_dict(first.state_dict())
    assert second.get_last_lr() == pytest.approx([0.55])
