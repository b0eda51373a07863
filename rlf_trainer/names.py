"""The trainer's closed vocabularies, each defined once (config, losses and advantages import them)."""

from __future__ import annotations

from typing import Literal, get_args

LossName = Literal["grpo", "dr_grpo", "dapo", "gspo"]
KLEstimatorName = Literal["k1", "k2", "k3"]
TurnRewardMode = Literal["sum", "discounted", "per_turn_advantage"]

LOSS_NAMES: tuple[str, ...] = get_args(LossName)
KL_ESTIMATOR_NAMES: tuple[str, ...] = get_args(KLEstimatorName)
TURN_REWARD_MODES: tuple[str, ...] = get_args(TurnRewardMode)
