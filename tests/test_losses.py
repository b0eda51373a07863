"""rlf_trainer.algorithms.losses against values computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlf_trainer.algorithms.advantages import overlong_penalty, turn_advantages
from rlf_trainer.algorithms.losses import (
    LossSpec,
    Normaliser,
    aggregate,
    approx_kl,
    loss_terms,
    masked_kl,
    policy_loss,
    selective_log_softmax,
    token_entropy,
    truncated_importance_weights,
)


def kl_k1(logp, ref):
    return masked_kl(logp, ref, torch.ones_like(logp), "k1")


def kl_k2(logp, ref):
    return masked_kl(logp, ref, torch.ones_like(logp), "k2")


def kl_k3(logp, ref):
    return masked_kl(logp, ref, torch.ones_like(logp), "k3")


def seq_mean_token_mean(values, mask):
    return ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


def grpo_loss(logp, old, adv, mask, *, eps=0.2, **kwargs):
    return policy_loss("grpo", logp, old, adv, mask, eps_low=eps, **kwargs)


def dr_grpo_loss(logp, old, adv, mask, *, max_len, eps=0.2):
    return policy_loss("dr_grpo", logp, old, adv, mask, eps_low=eps, max_len=max_len)


def dapo_loss(logp, old, adv, mask, **kwargs):
    return policy_loss("dapo", logp, old, adv, mask, **kwargs)


def gspo_loss(logp, old, adv, mask, **kwargs):
    return policy_loss("gspo", logp, old, adv, mask, **kwargs)


# ---------------------------------------------------------------- advantages


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 6), st.integers(1, 4), st.data())
def test_advantages_sum_to_zero_and_have_unit_std_per_group(group_size, num_groups, data):
    values = data.draw(
        st.lists(st.floats(-5, 5), min_size=group_size * num_groups, max_size=group_size * num_groups)
    )
    adv = torch.tensor(
        turn_advantages([[v] for v in values], group_size, mode="sum", eps=1e-12), dtype=torch.float64
    ).reshape(num_groups, group_size)
    rewards = torch.tensor(values, dtype=torch.float64).reshape(num_groups, group_size)
    # Zero up to the rounding of the group mean (an ulp of the largest reward per reward), which a
    # spread of a few ulps (e.g. [5.0, 4.999999999999999]) magnifies by 1 / (std + eps).
    ulp = torch.from_numpy(np.spacing(rewards.abs().amax(dim=1).numpy()))
    rounding = 2 * group_size * ulp / (rewards.std(dim=1) + 1e-12)
    assert (adv.sum(dim=1).abs() <= 1e-9 + rounding).all()
    for row, adv_row in zip(rewards, adv, strict=True):
        if row.std() > 1e-3:
            assert adv_row.std().item() == pytest.approx(1.0, abs=1e-6)
        elif row.max() == row.min():
            assert adv_row.abs().max().item() == 0.0


def test_overlong_penalty_by_hand():
    # L_max 20, L_cache 10: free up to 10, then (10 - len) / 10 down to -1 at 20, -1 beyond
    lengths = torch.tensor([5, 10, 12, 15, 20, 25])
    assert overlong_penalty(lengths, max_len=20, cache_len=10).tolist() == pytest.approx(
        [0.0, 0.0, -0.2, -0.5, -1.0, -1.0]
    )
    with pytest.raises(ValueError):
        overlong_penalty(lengths, max_len=20, cache_len=0)


# ---------------------------------------------------------------- logprobs, entropy, KL


def test_selective_log_softmax_matches_full_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 50)
    ids = torch.randint(0, 50, (3, 5))
    expected = torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(selective_log_softmax(logits, ids), expected, atol=1e-6)
    # bf16 logits are promoted to float32 before the logsumexp
    got = selective_log_softmax(logits.bfloat16(), ids)
    assert got.dtype == torch.float32
    reference = torch.log_softmax(logits.bfloat16().float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(got, reference, atol=1e-5)


def test_selective_log_softmax_is_differentiable():
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    selective_log_softmax(logits, torch.tensor([[2]])).sum().backward()
    # d log softmax_2 / d z = onehot(2) - softmax = (-.25, -.25, .75, -.25)
    assert logits.grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.75, -0.25])


def test_token_entropy():
    assert token_entropy(torch.zeros(2, 4)).tolist() == pytest.approx([math.log(4)] * 2)
    peaked = torch.tensor([100.0, 0.0, 0.0])
    assert token_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
    probs = torch.tensor([0.5, 0.25, 0.25])
    assert token_entropy(probs.log()).item() == pytest.approx(-(probs * probs.log()).sum().item(), abs=1e-6)


def test_kl_estimators_by_hand():
    # pi(x) = .5, pi_ref(x) = .25: rho = pi_ref / pi = .5
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_k1(logp, ref).item() == pytest.approx(math.log(2))  # -log rho
    assert kl_k2(logp, ref).item() == pytest.approx(0.5 * math.log(0.5) ** 2)  # .2402
    assert kl_k3(logp, ref).item() == pytest.approx(0.5 - 1 - math.log(0.5))  # .1931


def test_k1_and_k3_are_unbiased_for_kl_policy_to_reference_not_the_reverse():
    pi = torch.tensor([0.98, 0.01, 0.01], dtype=torch.float64)
    ref = torch.tensor([1 / 3, 1 / 3, 1 / 3], dtype=torch.float64)
    kl_pi_ref = (pi * (pi / ref).log()).sum().item()
    kl_ref_pi = (ref * (ref / pi).log()).sum().item()
    assert abs(kl_pi_ref - kl_ref_pi) > 0.3  # the direction is distinguishable
    # the tokens are sampled from pi: the expectation is a pi-weighted sum
    for estimator in (kl_k1, kl_k3):
        assert (pi * estimator(pi.log(), ref.log())).sum().item() == pytest.approx(kl_pi_ref, abs=1e-9)
    rho = ref / pi  # per token: k3 = rho - 1 - log rho, k2 = (log rho)^2 / 2
    assert torch.allclose(kl_k3(pi.log(), ref.log()), rho - 1 - rho.log())
    assert torch.allclose(kl_k2(pi.log(), ref.log()), rho.log() ** 2 / 2)


# ---------------------------------------------------------------- policy losses

# Two sequences, three positions. Sequence 1 trains on 2 tokens with A = +1, ratios 1.5, .5;
# sequence 2 on 3 tokens with A = -1, ratios 1, 1.5, .5.
RATIOS = torch.tensor([[1.5, 0.5, 1.0], [1.0, 1.5, 0.5]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([1.0, -1.0])


def _logps(requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.log(torch.tensor([[0.3, 0.2, 0.1], [0.4, 0.1, 0.2]]))
    new = (old + RATIOS.log()).detach().requires_grad_(requires_grad)
    return new, old


def test_grpo_loss_by_hand():
    logp, old = _logps(requires_grad=True)
    loss, metrics = grpo_loss(logp, old, ADV, MASK, eps=0.2)
    # seq 1: -min(1.5, 1.2) = -1.2 ; -min(.5, .8) = -.5   -> mean -.85
    # seq 2: -min(-1, -1) = 1 ; -min(-1.5, -1.2) = 1.5 ; -min(-.5, -.8) = .8 -> mean 1.1
    assert loss.item() == pytest.approx((-0.85 + 1.1) / 2)
    # clipped (gradient removed): seq1 tok1 (1.5 > 1.2, A > 0), seq2 tok3 (.5 < .8, A < 0): 2 of 5
    assert metrics["clip_fraction"].item() == pytest.approx(0.4)
    assert metrics["ratio_mean"].item() == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of -r A is -r A; weights 1/|o_i| * 1/B. Clipped tokens and the masked one get 0.
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5 / 2 / 2, 0.0])
    assert logp.grad[1].tolist() == pytest.approx([1.0 / 3 / 2, 1.5 / 3 / 2, 0.0])


def test_dr_grpo_loss_sums_tokens_over_a_constant():
    logp, old = _logps()
    loss, _ = dr_grpo_loss(logp, old, ADV, MASK, max_len=4, eps=0.2)
    # token terms -1.2 -.5 +1 +1.5 +.8 = 1.6, over B * L_max = 8
    assert loss.item() == pytest.approx(0.2)


def test_dapo_loss_clips_higher_and_averages_over_all_tokens():
    logp, old = _logps()
    loss, metrics = dapo_loss(logp, old, ADV, MASK, eps_low=0.2, eps_high=0.28)
    # -min(1.5, 1.28) = -1.28 ; -.5 ; 1 ; -min(-1.5, -1.28) = 1.5 ; -min(-.5, -.8) = .8 -> 1.52 / 5
    assert loss.item() == pytest.approx(1.52 / 5)
    assert metrics["clip_fraction"].item() == pytest.approx(0.4)


def test_gspo_loss_uses_one_ratio_per_sequence():
    logp, old = _logps(requires_grad=True)
    loss, metrics = gspo_loss(logp, old, ADV, MASK, eps_low=3e-4, eps_high=4e-4)
    s1 = math.exp((math.log(1.5) + math.log(0.5)) / 2)  # sqrt(.75) = .8660, A > 0: unclipped term is smaller
    s2 = math.exp((math.log(1.0) + math.log(1.5) + math.log(0.5)) / 3)  # .9086, A < 0: clipped at 1 - 3e-4
    assert loss.item() == pytest.approx((-s1 + (1 - 3e-4)) / 2, abs=1e-6)
    assert metrics["clip_fraction"].item() == pytest.approx(0.5)  # one sequence of two
    assert metrics["ratio_mean"].item() == pytest.approx((s1 + s2) / 2, abs=1e-6)
    loss.backward()
    # seq 1: d(-s1)/dlogp_t = -s1 / |o_1| for its two tokens; seq 2 is clipped: no gradient
    assert logp.grad[0].tolist() == pytest.approx([-s1 / 2 / 2, -s1 / 2 / 2, 0.0], abs=1e-6)
    assert logp.grad[1].abs().max().item() == 0.0
    # a per-token advantage is averaged over the sequence's trained tokens first
    per_token, _ = gspo_loss(logp, old, ADV[:, None].expand(2, 3), MASK)
    assert per_token.item() == pytest.approx(loss.item())


def test_micro_batch_shares_with_the_step_normaliser_add_up_to_the_batch_loss():
    logp, old = _logps()
    for variant in ("grpo", "dr_grpo", "dapo", "gspo"):
        whole, _ = policy_loss(variant, logp, old, ADV, MASK, max_len=4)
        spec = LossSpec(variant, max_len=4)
        norm = Normaliser.of(MASK, max_len=4)
        shares = 0.0
        for rows in ([0], [1]):
            terms, kl, _ = loss_terms(spec, logp[rows], old[rows], ADV[rows], MASK[rows])
            shares += aggregate(variant, terms, kl, MASK[rows], norm).item()
        assert shares == pytest.approx(whole.item(), abs=1e-6), variant


def test_one_kl_implementation_masks_untrained_tokens():
    logp, old = _logps()
    old = old.clone()
    old[0, 2] = -1e4  # an untrained position: it must not count
    expected = kl_k3(old[MASK > 0], logp[MASK > 0]).mean()  # the 5 trained tokens only
    assert approx_kl(logp, old, MASK).item() == pytest.approx(expected.item(), rel=1e-6)
    assert masked_kl(old, logp, MASK)[0, 2].item() == 0.0


def test_kl_penalty_is_added_per_token_and_reported():
    logp, old = _logps()
    ref = old - 0.1
    base, _ = grpo_loss(logp, old, ADV, MASK)
    with_kl, metrics = grpo_loss(logp, old, ADV, MASK, ref_logp=ref, beta=0.5)
    k3 = kl_k3(logp, ref)
    assert with_kl.item() == pytest.approx(base.item() + 0.5 * seq_mean_token_mean(k3, MASK).item(), abs=1e-6)
    assert metrics["kl"].item() == pytest.approx(((k3 * MASK).sum() / MASK.sum()).item(), abs=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, old, ADV, MASK, beta=0.1)


def test_no_ratio_change_gives_minus_mean_advantage_and_zero_kl():
    logp = torch.zeros(2, 4)
    loss, metrics = grpo_loss(logp, logp, torch.tensor([2.0, 1.0]), torch.ones(2, 4))
    assert loss.item() == pytest.approx(-1.5)
    assert metrics["approx_kl_old"].item() == 0.0
    assert metrics["clip_fraction"].item() == 0.0


@pytest.mark.parametrize("variant", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_extreme_values_on_untrained_positions_do_not_leak_nan(variant):
    # prompt / padding positions may hold any filler; exp(logp - old_logp) there would overflow to inf
    logp, old = _logps(requires_grad=False)
    logp = logp.clone()
    logp[0, 2] = 0.0
    old = old.clone()
    old[0, 2] = -1e4
    logp.requires_grad_(True)
    ref = old.clone()
    ref[0, 2] = 1e4
    loss, metrics = policy_loss(variant, logp, old, ADV, MASK, max_len=4, ref_logp=ref, beta=0.1)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(m) for m in metrics.values())
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0


def test_sequence_without_trained_tokens_counts_as_zero():
    values = torch.tensor([[2.0, 2.0], [5.0, 5.0]])
    assert seq_mean_token_mean(values, torch.tensor([[1.0, 1.0], [0.0, 0.0]])).item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("variant", "direct", "kwargs"),
    [
        ("grpo", grpo_loss, {"eps": 0.2}),
        ("dr_grpo", dr_grpo_loss, {"eps": 0.2, "max_len": 4}),
        ("dapo", dapo_loss, {"eps_low": 0.2, "eps_high": 0.28}),
        ("gspo", gspo_loss, {"eps_low": 3e-4, "eps_high": 4e-4}),
    ],
)
def test_policy_loss_dispatches_with_each_variants_defaults(variant, direct, kwargs):
    logp, old = _logps()
    expected, _ = direct(logp, old, ADV, MASK, **kwargs)
    got, metrics = policy_loss(variant, logp, old, ADV, MASK, max_len=4)
    assert got.item() == pytest.approx(expected.item())
    assert {"clip_fraction", "ratio_mean", "approx_kl_old"} <= set(metrics)
    assert all(not m.requires_grad and m.dim() == 0 for m in metrics.values())


def test_policy_loss_rejects_bad_configurations():
    logp, old = _logps()
    with pytest.raises(ValueError, match="max_len"):
        policy_loss("dr_grpo", logp, old, ADV, MASK)
    with pytest.raises(ValueError, match="symmetrically"):
        policy_loss("grpo", logp, old, ADV, MASK, eps_low=0.2, eps_high=0.3)
    with pytest.raises(ValueError, match="unknown loss variant"):
        policy_loss("ppo", logp, old, ADV, MASK)  # type: ignore[arg-type]


# ---------------------------------------------------------------- one KL, importance weights


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_every_loss_adds_the_chosen_kl_estimator_like_its_own_surrogate(estimator):
    logp, old = _logps()
    ref = old - 0.3
    _, per_token, metrics = loss_terms(
        LossSpec("grpo", beta=0.5, kl_estimator=estimator), logp, old, ADV, MASK, ref_logp=ref
    )
    expected = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}[estimator](logp, ref) * MASK
    assert torch.allclose(per_token * MASK, 0.5 * expected)
    assert metrics["kl"].item() == pytest.approx(expected.sum().item() / MASK.sum().item(), abs=1e-6)
    for variant, expected_share in [
        ("grpo", lambda v: seq_mean_token_mean(v, MASK)),
        ("dapo", lambda v: (v * MASK).sum() / MASK.sum()),
        ("dr_grpo", lambda v: (v * MASK).sum() / (v.shape[0] * 10)),
    ]:
        base, _ = policy_loss(variant, logp, old, ADV, MASK, max_len=10)
        with_kl, m = policy_loss(
            variant, logp, old, ADV, MASK, max_len=10, ref_logp=ref, beta=0.5, kl_estimator=estimator
        )
        assert with_kl.item() == pytest.approx(base.item() + expected_share(per_token).item(), abs=1e-6)
        assert m["kl"].item() == pytest.approx(metrics["kl"].item())


def test_truncated_importance_weights_scale_each_tokens_gradient():
    # sampler logprobs 0.5 and 2.0 below the trainer's: ratios e^0.5 = 1.65 and e^2 = 7.39 -> cap 2
    logp = torch.zeros(1, 3, requires_grad=True)
    sampler = torch.tensor([[-0.5, -2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    weights, metrics = truncated_importance_weights(logp, sampler, mask, cap=2.0)
    assert weights.tolist()[0] == pytest.approx([math.exp(0.5), 2.0, 0.0], abs=1e-6)
    assert metrics["tis/capped_fraction"].item() == pytest.approx(0.5)
    # Recomputed pi_old = pi_theta (ratio 1): d loss / d logp_t = -w_t * A / |o| per token.
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([1.0]), mask, token_weights=weights)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.5) / 2, -2.0 / 2, 0.0], abs=1e-6)
