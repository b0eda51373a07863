"""The trainer's closed vocabularies, and what a loss variant's name implies, each defined once.

Config, losses and advantages import them; :func:`clip_range` is the one home of the clip rules.

Example:
    >>> clip_range("dapo", None, None)
    (0.2, 0.28)
    >>> clip_range("grpo", 0.1, 0.3)
    Traceback (most recent call last):
    ...
    ValueError: grpo clips symmetrically; use variant='dapo' for eps_high != eps_low
"""

from __future__ import annotations

from typing import Literal, get_args

LossName = Literal["grpo", "dr_grpo", "dapo", "gspo"]
KLEstimatorName = Literal["k1", "k2", "k3"]
TurnRewardMode = Literal["sum", "discounted", "per_turn_advantage"]

LOSS_NAMES: tuple[str, ...] = get_args(LossName)
KL_ESTIMATOR_NAMES: tuple[str, ...] = get_args(KLEstimatorName)
TURN_REWARD_MODES: tuple[str, ...] = get_args(TurnRewardMode)


def clip_range(variant: str, eps_low: float | None, eps_high: float | None) -> tuple[float, float]:
    """Each variant's clip range, ``None`` meaning its default: grpo/dr_grpo 0.2/0.2 (symmetric
    only), dapo 0.2/0.28 (clip-higher), gspo 3e-4/4e-4 (a sequence-level ratio moves far less)."""
    if variant in ("grpo", "dr_grpo"):
        eps = 0.2 if eps_low is None else eps_low
        if eps_high is not None and eps_high != eps:
            raise ValueError(f"{variant} clips symmetrically; use variant='dapo' for eps_high != eps_low")
        return eps, eps
    if variant == "dapo":
        return (0.2 if eps_low is None else eps_low), (0.28 if eps_high is None else eps_high)
    if variant == "gspo":
        return (3e-4 if eps_low is None else eps_low), (4e-4 if eps_high is None else eps_high)
    raise ValueError(f"unknown loss variant {variant!r}; expected one of {', '.join(LOSS_NAMES)}")
