"""Turn-level rewards -> token advantages, against values computed by hand (arithmetic in comments)."""

from __future__ import annotations

import math

import pytest

from rlf_trainer.algorithms.advantages import returns_to_go, spread_over_tokens, turn_advantages


def token_advantages(turn_rewards, spans, width, group_size, **kwargs):
    return spread_over_tokens(turn_advantages(turn_rewards, group_size, **kwargs), spans, width)


# One group of three episodes. Per-turn rewards (a 0.1 tool-success bonus, then the answer's 1/0):
#   ep0: [0.1, 0.1, 1.0]   ep1: [0.1, 0.0]   ep2: [0.0]
REWARDS = [[0.1, 0.1, 1.0], [0.1, 0.0], [0.0]]


def test_returns_to_go_by_hand():
    # gamma 0.5: G2 = 1.0, G1 = 0.1 + 0.5 * 1.0 = 0.6, G0 = 0.1 + 0.5 * 0.6 = 0.4
    assert returns_to_go([0.1, 0.1, 1.0], 0.5) == pytest.approx([0.4, 0.6, 1.0])
    assert returns_to_go([], 0.5) == []


def test_sum_is_one_grpo_advantage_per_episode_over_its_return():
    # returns 1.2, 0.1, 0.0: mean 0.4333; unbiased std sqrt(((0.7667)^2 + (0.3333)^2 + (0.4333)^2) / 2)
    returns = [1.2, 0.1, 0.0]
    mean = sum(returns) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 2)
    adv = turn_advantages(REWARDS, 3, mode="sum")
    expected = [(r - mean) / (std + 1e-6) for r in returns]
    assert [len(a) for a in adv] == [3, 2, 1]
    for episode, value in zip(adv, expected, strict=True):
        assert episode == pytest.approx([value] * len(episode), abs=1e-6)


def test_discounted_credits_each_turn_with_what_came_after_against_one_baseline():
    # gamma 0.5: G(ep0) = [0.4, 0.6, 1.0]; G(ep1) = [0.1, 0.0]; G(ep2) = [0.0]
    # baseline: the discounted episode returns 0.4, 0.1, 0.0 -> mean 1/6 (no std scaling here)
    adv = turn_advantages(REWARDS, 3, mode="discounted", discount=0.5, normalize_std=False)
    b = 0.5 / 3
    assert adv[0] == pytest.approx([0.4 - b, 0.6 - b, 1.0 - b])
    assert adv[1] == pytest.approx([0.1 - b, 0.0 - b])
    assert adv[2] == pytest.approx([0.0 - b])


def test_per_turn_advantage_compares_each_turn_with_the_same_turn_of_the_group():
    # gamma 1: G(ep0) = [1.2, 1.1, 1.0]; G(ep1) = [0.1, 0.0]; G(ep2) = [0.0]
    # turn 0: {1.2, 0.1, 0.0} mean 0.4333; turn 1: {1.1, 0.0} mean 0.55; turn 2: {1.0} alone -> 0
    adv = turn_advantages(REWARDS, 3, mode="per_turn_advantage", normalize_std=False)
    m0 = 1.3 / 3
    assert adv[0] == pytest.approx([1.2 - m0, 1.1 - 0.55, 0.0])
    assert adv[1] == pytest.approx([0.1 - m0, 0.0 - 0.55])
    assert adv[2] == pytest.approx([0.0 - m0])
    # with std scaling, turn 1's pair {1.1, 0.0}: std = 1.1 / sqrt(2) -> +-0.55 / 0.7778 = +-0.7071
    scaled = turn_advantages(REWARDS, 3, mode="per_turn_advantage")
    assert scaled[0][1] == pytest.approx(1 / math.sqrt(2), abs=1e-5)
    assert scaled[1][1] == pytest.approx(-1 / math.sqrt(2), abs=1e-5)


def test_token_advantages_put_each_turns_value_on_that_turns_tokens_only():
    # ep0 generated columns 2-3, 5 and 7-8 (prompt and tool results in between); ep1 2-4 and 6; ep2 2
    spans = [[(2, 4), (5, 6), (7, 9)], [(2, 5), (6, 7)], [(2, 3)]]
    adv = token_advantages(REWARDS, spans, 10, 3, mode="per_turn_advantage", normalize_std=False)
    m0 = 1.3 / 3
    row0 = [0, 0, 1.2 - m0, 1.2 - m0, 0, 0.55, 0, 0, 0, 0]
    assert adv[0].tolist() == pytest.approx(row0, abs=1e-6)
    assert adv[1].tolist() == pytest.approx([0, 0, 0.1 - m0, 0.1 - m0, 0.1 - m0, 0, -0.55, 0, 0, 0], abs=1e-6)
    assert adv[2].tolist() == pytest.approx([0, 0, -m0, 0, 0, 0, 0, 0, 0, 0], abs=1e-6)


def test_mismatched_turns_and_bad_modes_are_clear_errors():
    with pytest.raises(ValueError, match="2 turn rewards for 1 generated turns"):
        token_advantages([[0.0, 1.0]], [[(0, 1)]], 2, 1, mode="sum")
    with pytest.raises(ValueError, match="unknown turn_rewards mode"):
        turn_advantages([[1.0]], 1, mode="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="groups of 2"):
        turn_advantages([[1.0]], 2, mode="sum")


def test_invalid_episodes_leave_the_baseline_and_get_zero():
    # ep1 flagged: the group is {ep0: 1.0, ep2: 0.0} -> mean 0.5, no std scaling
    adv = turn_advantages(
        [[1.0], [0.7], [0.0]], 3, mode="sum", normalize_std=False, valid=[True, False, True]
    )
    assert adv == [[0.5], [0.0], [-0.5]]
