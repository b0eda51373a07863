"""Advantages: group-relative baselines (GRPO, Dr. GRPO), DAPO's shaping, and turn-level rewards.

An episode's env may reward any step, not only the last (a successful tool call, a sub-goal):
``batch.turn_rewards[i][k]`` is the reward of episode ``i``'s generated turn ``k`` and
``batch.turn_spans[i][k]`` its token columns. :func:`turn_advantages` turns them into one
advantage per turn, by ``algorithm.turn_rewards``, and :func:`spread_over_tokens` puts each on its
turn's tokens:

- ``sum`` (the default): the episode's return ``R_i = sum_k r_ik`` gets one group-relative
  advantage that every token of the episode shares. With rewards only at the end this is plain
  GRPO, ``A_i = (R_i - mean_g R) / (std_g R + eps)`` (unbiased std, as TRL and verl), or Dr.
  GRPO's ``A_i = R_i - mean_g R`` without ``normalize_std``.
- ``discounted``: the tokens of turn ``k`` get the return-to-go ``G_ik = sum_{j>=k} gamma^(j-k) r_ij``
  minus the group's mean discounted return ``mean_g G_g0`` (divided by its std when normalising):
  a turn is credited with what came after it, against the same baseline for all turns.
- ``per_turn_advantage``: ``G_ik`` is compared with the return-to-go of the same turn ``k`` in the
  other episodes of the group that reached turn ``k`` (mean, and std when normalising); a turn
  that only one episode of its group reached gets 0.

Example:
    >>> import torch
    >>> adv = turn_advantages([[1.0], [0.0], [1.0], [1.0]], group_size=2, mode="sum")
    >>> [round(a[0], 3) for a in adv]
    [0.707, -0.707, 0.0, 0.0]
    >>> returns_to_go([0.1, 0.0, 1.0], discount=0.5)
    [0.35, 0.5, 1.0]
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import Tensor

from rlf_trainer.names import TURN_REWARD_MODES, TurnRewardMode


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int) -> Tensor:
    """DAPO's soft overlong punishment, added to the reward of each response (``algorithm.overlong_buffer``).

    With ``L_max = max_len`` and ``L_cache = cache_len``::

        R(y) = 0                                   if |y| <= L_max - L_cache
             = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
             = -1                                  if |y| > L_max

    Example:
        >>> overlong_penalty(torch.tensor([10, 15, 20, 25]), max_len=20, cache_len=10).tolist()
        [0.0, -0.5, -1.0, -1.0]
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(f"need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}")
    lengths = lengths.float()
    soft_start = max_len - cache_len
    ramp = (soft_start - lengths) / cache_len
    penalty = torch.where(lengths <= soft_start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_len, torch.full_like(lengths, -1.0), penalty)


# ----------------------------------------------------------------------------------------------
# Turn-level rewards
# ----------------------------------------------------------------------------------------------


def returns_to_go(rewards: Sequence[float], discount: float) -> list[float]:
    """``G_k = sum_{j>=k} discount^(j-k) r_j`` for every turn ``k``."""
    out, running = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = float(rewards[k]) + discount * running
        out[k] = running
    return out


def _normalized(value: float, others: Sequence[float], normalize_std: bool, eps: float) -> float:
    """``value`` against the group ``others`` (it included): centred, and scaled by the unbiased std."""
    if len(others) < 2 or max(others) == min(others):
        return 0.0  # equal rewards: no signal (fmean's rounding would otherwise leak through a tiny std)
    centred = value - statistics.fmean(others)
    return centred / (statistics.stdev(others) + eps) if normalize_std else centred


def turn_advantages(
    turn_rewards: Sequence[Sequence[float]],
    group_size: int,
    *,
    mode: TurnRewardMode,
    discount: float = 1.0,
    normalize_std: bool = True,
    eps: float = 1e-6,
    valid: Sequence[bool] | None = None,
) -> list[list[float]]:
    """One advantage per generated turn of each episode (episodes in groups of ``group_size``).

    ``valid[i]`` False (e.g. the user simulator failed in episode ``i``): the episode takes no part
    in its group's baseline and gets advantage 0 on every turn.

    Example:
        >>> turn_advantages([[0.0, 1.0], [0.0, 0.0]], 2, mode="per_turn_advantage", normalize_std=False)
        [[0.5, 0.5], [-0.5, -0.5]]
        >>> turn_advantages([[0.0, 1.0], [1.0]], 2, mode="discounted", discount=0.5, normalize_std=False)
        [[-0.25, 0.25], [0.25]]
    """
    if mode not in TURN_REWARD_MODES:
        raise ValueError(
            f"unknown turn_rewards mode {mode!r}; expected one of {', '.join(TURN_REWARD_MODES)}"
        )
    if len(turn_rewards) % group_size:
        raise ValueError(f"{len(turn_rewards)} episodes do not split into groups of {group_size}")
    gamma = 1.0 if mode == "sum" else discount
    togo = [returns_to_go(rewards, gamma) for rewards in turn_rewards]
    ok = [True] * len(togo) if valid is None else [bool(v) for v in valid]
    out: list[list[float]] = []
    for start in range(0, len(togo), group_size):
        members = range(start, start + group_size)
        group = [togo[i] for i in members if ok[i]]
        episode_returns = [g[0] if g else 0.0 for g in group]
        for i in members:
            g = togo[i]
            if not ok[i]:
                out.append([0.0] * len(g))
            elif mode == "per_turn_advantage":
                same_turn = [[other[k] for other in group if len(other) > k] for k in range(len(g))]
                out.append([_normalized(g[k], same_turn[k], normalize_std, eps) for k in range(len(g))])
            elif mode == "discounted":
                out.append([_normalized(value, episode_returns, normalize_std, eps) for value in g])
            else:
                advantage = _normalized(g[0] if g else 0.0, episode_returns, normalize_std, eps)
                out.append([advantage] * len(g))
    return out


def spread_over_tokens(
    per_turn: Sequence[Sequence[float]], turn_spans: Sequence[Sequence[tuple[int, int]]], width: int
) -> Tensor:
    """``[N, width]``: value ``per_turn[i][k]`` on the columns ``turn_spans[i][k]``, 0 elsewhere.

    Example:
        >>> spread_over_tokens([[2.0, 3.0]], [[(0, 1), (2, 4)]], 4).tolist()
        [[2.0, 0.0, 3.0, 3.0]]
    """
    out = torch.zeros((len(per_turn), width), dtype=torch.float32)
    for row, (advantages, spans) in enumerate(zip(per_turn, turn_spans, strict=True)):
        if len(advantages) != len(spans):
            raise ValueError(
                f"episode {row}: {len(advantages)} turn rewards for {len(spans)} generated turns"
            )
        for advantage, (start, end) in zip(advantages, spans, strict=True):
            out[row, start:end] = advantage
    return out
