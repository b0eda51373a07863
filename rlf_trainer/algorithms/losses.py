"""GRPO-family losses as pure tensor functions, each a few lines beside its formula.

Shapes: ``B`` sequences (prompt x sample), ``T`` token positions, ``G`` samples per prompt.
Every per-token tensor is ``[B, T]`` and aligned with ``loss_mask`` (1 on tokens the policy
generated and is trained on, 0 on prompt, tool-result and padding tokens). Advantages are one per
sequence (``[B]``) or per token (``[B, T]``).

Notation: ``logp = log pi_theta(token)``, ``old_logp = log pi_old(token)`` (the policy that sampled),
``ref_logp = log pi_ref(token)``; the importance ratio is ``r = exp(logp - old_logp)``.

A loss is two calls: :func:`loss_terms` gives the per-token (GSPO: per-sequence) terms of a
variant, the clipped surrogate plus ``beta`` times the KL to the reference model, and
:func:`aggregate` reduces them with the variant's normaliser (:class:`Normaliser`). The trainer
computes the normaliser once per optimizer step over every micro-batch of every process, so the
micro-batch losses add up to the loss of the whole batch; :func:`policy_loss` is both calls on one
batch. There is one KL implementation, :func:`masked_kl`, used for the penalty, for
``approx_kl_old`` and for ``sampler_kl``. Demonstration tokens (``algorithm.guidance``) take
:func:`policy_shaping_terms` (LUFFY) in place of the clipped surrogate.

The advantages themselves (group baselines, turn rewards) are in :mod:`rlf_trainer.algorithms.advantages`.

Example:
    >>> import torch
    >>> lp = torch.zeros(2, 3); mask = torch.ones(2, 3)
    >>> loss, metrics = policy_loss("grpo", lp, lp, torch.tensor([1.0, -1.0]), mask)
    >>> loss.item(), metrics["clip_fraction"].item()
    (0.0, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlf_trainer.names import KLEstimatorName, LossName, clip_range

Metrics = dict[str, Tensor]

# ----------------------------------------------------------------------------------------------
# Token log-probabilities, entropy and KL estimators
# ----------------------------------------------------------------------------------------------


def selective_log_softmax(logits: Tensor, ids: Tensor) -> Tensor:
    """``log_softmax(logits)[..., ids]`` without materialising the full ``[B, T, V]`` log-softmax.

    ``logits``: ``[B, T, V]``, ``ids``: ``[B, T]`` -> ``[B, T]`` (float32, or float64 for float64 logits).
    One sequence at a time, so the extra memory is one ``[T, V]`` row in float32 rather than the batch.

    Example:
        >>> logits = torch.log(torch.tensor([[[0.25, 0.75]]]))
        >>> round(selective_log_softmax(logits, torch.tensor([[1]])).exp().item(), 4)
        0.75
    """
    out_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    rows = []
    for row_logits, row_ids in zip(logits, ids, strict=True):
        row_logits = row_logits.to(out_dtype)  # bf16 logsumexp over a large vocab loses ~1e-2
        picked = row_logits.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of each position's next-token distribution: ``H = logsumexp(z) - sum_v softmax(z)_v z_v``.

    ``[..., V] -> [...]``, computed in float32.

    Example:
        >>> round(token_entropy(torch.zeros(4)).item(), 4) == round(float(torch.log(torch.tensor(4.0))), 4)
        True
    """
    logits = logits.float()
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


# KL(pi || pi_ref) = E_{x ~ pi}[log pi(x) - log pi_ref(x)]. The tokens were sampled by the policy,
# so with the per-token ratio  rho = pi_ref(x) / pi(x)  Schulman's estimators (http://joschu.net/blog/kl-approx.html,
# his r = p/q with q = pi the sampler and p = pi_ref) are:
#   k1 = -log rho                   unbiased, high variance, can be negative
#   k2 = 0.5 * (log rho)^2          biased (low), low variance, >= 0
#   k3 = (rho - 1) - log rho        unbiased, low variance, >= 0   (GRPO's choice)
KL_ESTIMATORS = {
    "k1": lambda log_rho: -log_rho,
    "k2": lambda log_rho: 0.5 * log_rho**2,
    "k3": lambda log_rho: torch.exp(log_rho) - 1 - log_rho,
}


def masked_kl(logp: Tensor, other_logp: Tensor, mask: Tensor, estimator: KLEstimatorName = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_other) on tokens sampled from pi; 0 where ``mask`` is 0.

    The one KL of the trainer: the penalty (``other`` = the reference model), ``approx_kl_old``
    (KL(pi_old || pi): ``logp`` = old, ``other`` = current) and ``sampler_kl``.

    Example:
        >>> lp = torch.zeros(1, 2); mask = torch.tensor([[1.0, 0.0]])
        >>> masked_kl(lp, lp - 1.0, mask, "k1").tolist(), masked_kl(lp, lp + 50, mask, "k3")[0, 1].item()
        ([[1.0, 0.0]], 0.0)
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {sorted(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator](-_masked_log_ratio(logp, other_logp, mask))


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def _masked_log_ratio(logp: Tensor, other_logp: Tensor, mask: Tensor) -> Tensor:
    """``logp - other_logp`` on trained tokens, 0 elsewhere.

    Untrained positions may hold anything (prompt logprobs, padding fillers); exp() of a large
    difference there is inf, and inf * 0 in the masked sum (or in its backward pass) is nan.
    """
    return torch.where(mask > 0, logp - other_logp, torch.zeros_like(logp))


def approx_kl(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(pi_old || pi) on the sampled tokens (CleanRL's ``approx_kl``), no gradient."""
    with torch.no_grad():
        return masked_mean(masked_kl(old_logp, logp, mask), mask)


def truncated_importance_weights(
    logp: Tensor, sampler_logp: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, Metrics]:
    """Per-token ``min(pi_theta / pi_sampler, cap)``, detached: TIS, the off-policy correction.

    The engine that sampled (vLLM, or the policy one step behind under ``rollout.overlap``) is not
    exactly the model being trained. Weighting each token's surrogate by this ratio makes the
    gradient an estimate under the trained policy again; the cap bounds its variance (Yao et al.,
    "Your efficient RL framework secretly brings you off-policy RL training", 2025). Untrained
    positions get weight 0. Metrics: ``tis/weight_mean`` and ``tis/capped_fraction``.

    Example:
        >>> w, m = truncated_importance_weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, -2.0]]),
        ...                                    torch.ones(1, 2), cap=2.0)
        >>> w.tolist(), m["tis/capped_fraction"].item()
        ([[1.0, 2.0]], 0.5)
    """
    with torch.no_grad():
        ratio = torch.exp(_masked_log_ratio(logp.detach(), sampler_logp, mask))
        weights = torch.clamp(ratio, max=cap) * mask.to(ratio.dtype)
        metrics = {
            "tis/weight_mean": masked_mean(weights, mask),
            "tis/capped_fraction": masked_mean((ratio > cap).float(), mask),
        }
    return weights, metrics


# Off-policy demonstrations inside a group (algorithm.guidance): LUFFY's policy shaping (Yan et al.,
# 2025, "Learning to Reason under Off-Policy Guidance", arXiv 2504.14945). A demonstration has no
# sampler probability (a scripted oracle's or an endpoint's turns), so its importance ratio
# pi_theta / pi_demo is taken with pi_demo = 1 and, instead of pi_theta itself, shaped:
#     term_t = -f(pi_t) A_t,    f(p) = p / (p + gamma),    pi_t = exp(logp_t),   no clip.
# Why shaping and not plain importance weighting with a cap: with pi_demo = 1 the plain weight is
# pi_t itself, whose gradient pi_t * grad(log pi_t) vanishes on exactly the tokens the policy does
# not know yet (pi_t = 0.01 -> 0.01), while it pushes hardest on tokens it already predicts
# (pi_t = 0.9 -> 0.9: sharpening, entropy collapse); a cap bounds the large side only. The shaped
# gradient f'(pi_t) pi_t grad(log pi_t) = gamma pi_t / (pi_t + gamma)^2 grad(log pi_t) lifts the rare
# tokens (0.083 at pi_t = 0.01 with gamma 0.1, 8x) and damps the known ones (0.09 at pi_t = 0.9, 10x less).
def policy_shaping_terms(logp: Tensor, advantages: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Per-token terms of demonstration tokens, ``-f(pi) A`` with ``f(p) = p / (p + gamma)`` (LUFFY).

    ``logp`` ``[B, T]`` is log pi_theta of the demonstration's tokens, ``advantages`` ``[B]`` or
    ``[B, T]``; 0 where ``mask`` is 0. No ratio to pi_old and no clip: the demonstration's
    probability is unknown (taken as 1), and the shaping bounds the term (``|f| < 1``). Aggregated
    like the policy's own terms (:func:`aggregate`); the KL penalty leaves these tokens out (its
    estimators hold only for tokens the policy sampled).

    Example: pi = 0.9 and 0.1 with gamma 0.1 give f = 0.9 and 0.5.
        >>> terms = policy_shaping_terms(torch.tensor([[0.9, 0.1, 0.5]]).log(), torch.tensor([2.0]),
        ...                              torch.tensor([[1.0, 1.0, 0.0]]), gamma=0.1)
        >>> [round(v, 4) for v in terms[0].tolist()]
        [-1.8, -1.0, 0.0]
    """
    if gamma <= 0:
        raise ValueError(f"policy shaping needs gamma > 0, got {gamma}")
    mask = mask.to(logp.dtype)
    adv = advantages.unsqueeze(-1).expand_as(logp) if advantages.dim() == 1 else advantages
    prob = torch.exp(torch.where(mask > 0, logp, torch.zeros_like(logp)))  # exp of a masked filler is inf
    return torch.where(mask > 0, -(prob / (prob + gamma)) * adv, torch.zeros_like(logp))


def _clip_metrics(ratio: Tensor, adv: Tensor, mask: Tensor, eps_low: float, eps_high: float) -> Metrics:
    """``clip_fraction``: tokens (GSPO: sequences) whose gradient the clip removes; ``ratio_mean``."""
    with torch.no_grad():
        clipped = ((ratio > 1 + eps_high) & (adv > 0)) | ((ratio < 1 - eps_low) & (adv < 0))
        return {"clip_fraction": masked_mean(clipped.float(), mask), "ratio_mean": masked_mean(ratio, mask)}


@dataclass(frozen=True)
class LossSpec:
    """What a loss needs besides the tensors: the variant, its clip range, the KL penalty, Dr. GRPO's budget."""

    variant: LossName = "grpo"
    eps_low: float | None = None
    eps_high: float | None = None
    beta: float = 0.0
    kl_estimator: KLEstimatorName = "k3"
    max_len: int | None = None


def loss_terms(
    spec: LossSpec,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    ref_logp: Tensor | None = None,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, Metrics]:
    """The variant's surrogate terms ``[B, T]`` (GSPO: ``[B]``) and the ``beta * KL`` terms ``[B, T]``.

    Token variants (grpo, dr_grpo, dapo), ``r_t = pi/pi_old`` per token, ``A`` per token or sequence:
        ``term_t = -w_t min(r_t A, clip(r_t, 1-eps_low, 1+eps_high) A)``   (``w``: TIS weights)
    GSPO, one ratio per sequence, the geometric mean of its token ratios, ``A_i`` per sequence
    (a per-token ``A`` is averaged over the sequence's tokens first):
        ``s_i = exp(1/|o_i| sum_t (logp_it - old_logp_it))``,
        ``term_i = -w_i min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i)``
    KL: ``beta * k(pi || pi_ref)`` per token (:func:`masked_kl`); zeros when ``beta == 0``.
    Metrics (detached): ``clip_fraction``, ``ratio_mean``, ``approx_kl_old`` and, with beta, ``kl``.
    """
    eps_low, eps_high = clip_range(spec.variant, spec.eps_low, spec.eps_high)
    mask = mask.to(logp.dtype)
    adv = advantages
    if spec.variant == "gspo":
        if adv.dim() == 2:
            adv = (adv * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
        count = mask.sum(dim=-1).clamp(min=1)
        ratio = torch.exp(_masked_log_ratio(logp, old_logp, mask).sum(dim=-1) / count)
        surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
        if token_weights is not None:  # one weight per sequence: the mean of its tokens' weights
            surrogate = surrogate * (token_weights.detach() * mask).sum(dim=-1) / count
        has_tokens = (mask.sum(dim=-1) > 0).to(logp.dtype).unsqueeze(-1)
        metrics = _clip_metrics(ratio.unsqueeze(-1), adv.unsqueeze(-1), has_tokens, eps_low, eps_high)
    else:
        adv = adv.unsqueeze(-1).expand_as(logp) if adv.dim() == 1 else adv
        ratio = torch.exp(_masked_log_ratio(logp, old_logp, mask))
        surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
        if token_weights is not None:
            surrogate = surrogate * token_weights.detach()
        metrics = _clip_metrics(ratio, adv, mask, eps_low, eps_high)
    metrics["approx_kl_old"] = approx_kl(logp, old_logp, mask)
    kl = torch.zeros_like(logp)
    if spec.beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (log-probs of the reference model)")
        per_token_kl = masked_kl(logp, ref_logp, mask, spec.kl_estimator)
        kl = spec.beta * per_token_kl
        metrics["kl"] = masked_mean(per_token_kl.detach(), mask)
    return -surrogate, kl, metrics


@dataclass(frozen=True)
class Normaliser:
    """The denominators of one optimizer step: its sequences and trained tokens, over every
    micro-batch of every process, and the generation budget (Dr. GRPO)."""

    sequences: float
    tokens: float
    max_len: int | None = None

    @staticmethod
    def of(mask: Tensor, max_len: int | None = None) -> Normaliser:
        """The normaliser of a single batch (``mask`` ``[B, T]``)."""
        return Normaliser(float(mask.shape[0]), float(mask.sum()), max_len)


def aggregate(variant: LossName, terms: Tensor, kl: Tensor, mask: Tensor, norm: Normaliser) -> Tensor:
    """This micro-batch's share of the step's loss; the shares of all micro-batches add up to it.

    With ``N`` sequences and ``sum_i |o_i|`` trained tokens in the whole step (``norm``):
        grpo:    ``1/N sum_i 1/|o_i| sum_t (term_it + kl_it)``    (mean per sequence, then over sequences)
        dr_grpo: ``1/(N L_max) sum_i sum_t (term_it + kl_it)``    (a constant: no length bias)
        dapo:    ``1/sum_i |o_i| sum_i sum_t (term_it + kl_it)``  (token-level mean over the batch)
        gspo:    ``1/N sum_i (term_i + 1/|o_i| sum_t kl_it)``     (one term per sequence)
    A sequence without trained tokens counts 0 but stays in ``N``.
    """
    mask = mask.to(kl.dtype)
    per_sequence_tokens = mask.sum(dim=-1).clamp(min=1)
    if variant == "grpo":
        return (((terms + kl) * mask).sum(dim=-1) / per_sequence_tokens).sum() / max(norm.sequences, 1.0)
    if variant == "dr_grpo":
        if norm.max_len is None:
            raise ValueError("dr_grpo needs max_len (the constant normaliser: the generation budget)")
        return ((terms + kl) * mask).sum() / (max(norm.sequences, 1.0) * norm.max_len)
    if variant == "dapo":
        return ((terms + kl) * mask).sum() / max(norm.tokens, 1.0)
    if variant == "gspo":
        return (terms + (kl * mask).sum(dim=-1) / per_sequence_tokens).sum() / max(norm.sequences, 1.0)
    raise ValueError(f"unknown loss variant {variant!r}; expected one of grpo, dr_grpo, dapo, gspo")


def policy_loss(
    variant: LossName,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float | None = None,
    eps_high: float | None = None,
    max_len: int | None = None,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimatorName = "k3",
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """The loss of one whole batch: :func:`loss_terms`, then :func:`aggregate` with the batch's own normaliser.

    Example:
        >>> lp = torch.zeros(2, 3); mask = torch.ones(2, 3)
        >>> loss, metrics = policy_loss("dapo", lp, lp, torch.tensor([1.0, -1.0]), mask)
        >>> loss.item(), sorted(metrics)
        (0.0, ['approx_kl_old', 'clip_fraction', 'ratio_mean'])
    """
    spec = LossSpec(variant, eps_low, eps_high, beta, kl_estimator, max_len)
    terms, kl, metrics = loss_terms(
        spec, logp, old_logp, advantages, loss_mask, ref_logp=ref_logp, token_weights=token_weights
    )
    return aggregate(variant, terms, kl, loss_mask, Normaliser.of(loss_mask, max_len)), metrics
