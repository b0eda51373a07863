"""GRPO-family losses as pure tensor functions, each a few lines beside its formula.

Shapes: ``B`` sequences (prompt x sample), ``T`` token positions, ``G`` samples per prompt.
Every per-token tensor is ``[B, T]`` and aligned with ``loss_mask`` (1 on tokens the policy
generated and is trained on, 0 on prompt, tool-result and padding tokens). Advantages are one per
sequence (``[B]``) or per token (``[B, T]``).

Notation: ``logp = log pi_theta(token)``, ``old_logp = log pi_old(token)`` (the policy that sampled),
``ref_logp = log pi_ref(token)``; the importance ratio is ``r = exp(logp - old_logp)``.

Every loss takes the same optional extras: ``ref_logp``, ``beta`` and ``kl_estimator`` add the KL
penalty to the reference model (one implementation, :func:`kl_penalty`, aggregated like the
variant's own surrogate), and ``token_weights`` multiplies each token's surrogate by a fixed
importance weight (the truncated sampler correction of :func:`truncated_importance_weights`).

The advantages themselves (group baselines, turn rewards) are in :mod:`rlf_trainer.advantages`.

Example:
    >>> import torch
    >>> lp = torch.zeros(2, 3); mask = torch.ones(2, 3)
    >>> loss, metrics = policy_loss("grpo", lp, lp, torch.tensor([1.0, -1.0]), mask)
    >>> loss.item(), metrics["clip_fraction"].item()
    (0.0, 0.0)
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

LossVariant = Literal["grpo", "dr_grpo", "dapo", "gspo"]
KLEstimatorName = Literal["k1", "k2", "k3"]
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


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token ``k1 = log pi - log pi_ref`` estimator of KL(pi || pi_ref)."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token ``k2 = 0.5 * (log pi_ref - log pi)^2`` estimator of KL(pi || pi_ref)."""
    return 0.5 * (ref_logp - logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token ``k3 = pi_ref/pi - 1 - log(pi_ref/pi)`` estimator of KL(pi || pi_ref) (GRPO's).

    Example:
        >>> kl_k3(torch.tensor([0.0]), torch.tensor([0.0])).tolist()
        [0.0]
    """
    log_rho = ref_logp - logp
    return torch.exp(log_rho) - 1 - log_rho


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


# ----------------------------------------------------------------------------------------------
# Aggregation over masked tokens
# ----------------------------------------------------------------------------------------------


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over positions where ``mask`` is 1 (0 when the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def seq_mean_token_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean over each sequence's masked tokens, then mean over sequences (GRPO's ``1/G sum_i 1/|o_i| sum_t``).

    A sequence without any masked token counts as 0 (it still weighs in the batch mean).
    """
    mask = mask.to(values.dtype)
    per_sequence = (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return per_sequence.mean()


def token_sum_over_constant(values: Tensor, mask: Tensor, max_len: int) -> Tensor:
    """Sum over all masked tokens / (B * max_len): Dr. GRPO's length-unbiased aggregation."""
    return (values * mask.to(values.dtype)).sum() / (values.shape[0] * max_len)


def _masked_log_ratio(logp: Tensor, other_logp: Tensor, mask: Tensor) -> Tensor:
    """``logp - other_logp`` on trained tokens, 0 elsewhere.

    Untrained positions may hold anything (prompt logprobs, padding fillers); exp() of a large
    difference there is inf, and inf * 0 in the masked sum (or in its backward pass) is nan.
    """
    return torch.where(mask > 0, logp - other_logp, torch.zeros_like(logp))


def _per_token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


def _clip_metrics(ratio: Tensor, adv: Tensor, mask: Tensor, eps_low: float, eps_high: float) -> Metrics:
    """Diagnostics against the sampling policy (no gradient).

    ``clip_fraction``: tokens whose gradient the clip removes (ratio above ``1+eps_high`` with a
    positive advantage, or below ``1-eps_low`` with a negative one).
    """
    with torch.no_grad():
        clipped = ((ratio > 1 + eps_high) & (adv > 0)) | ((ratio < 1 - eps_low) & (adv < 0))
        return {"clip_fraction": masked_mean(clipped.float(), mask), "ratio_mean": masked_mean(ratio, mask)}


def approx_kl(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """k3 estimate of KL(pi_old || pi) on the sampled tokens (CleanRL's ``approx_kl``), no gradient.

    The trainer's ``sampler_kl`` is this with the sampler's recorded logprobs as ``old_logp``.
    """
    with torch.no_grad():
        log_ratio = _masked_log_ratio(logp, old_logp, mask)
        return masked_mean(torch.exp(log_ratio) - 1 - log_ratio, mask)


def kl_penalty(
    logp: Tensor, ref_logp: Tensor | None, beta: float, mask: Tensor, estimator: KLEstimatorName = "k3"
) -> tuple[Tensor, Metrics]:
    """Per-token ``beta * KL`` to the reference model with the chosen estimator; metric ``kl``.

    Zeros (and no metric) when ``beta == 0``: no reference model is needed then. Untrained
    positions count 0 (their ``ref_logp`` is replaced by ``logp``, see :func:`_masked_log_ratio`).

    Example:
        >>> lp = torch.zeros(1, 2); mask = torch.tensor([[1.0, 0.0]])
        >>> per_token, metrics = kl_penalty(lp, lp - 1.0, 0.5, mask, "k1")
        >>> per_token.tolist(), metrics["kl"].item()
        ([[0.5, 0.0]], 1.0)
    """
    if beta == 0.0:
        return torch.zeros_like(logp), {}
    if ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp (log-probs of the reference model)")
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {sorted(KL_ESTIMATORS)}")
    kl = KL_ESTIMATORS[estimator](logp, torch.where(mask > 0, ref_logp, logp))
    return beta * kl, {"kl": masked_mean(kl.detach(), mask)}


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


def _ppo_clip_per_token(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    # PPO surrogate, token by token:  -w min(r A, clip(r, 1-eps_low, 1+eps_high) A)
    ratio = torch.exp(_masked_log_ratio(logp, old_logp, mask))
    adv = _per_token_advantages(advantages, logp)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)
    if token_weights is not None:
        surrogate = surrogate * token_weights.detach()
    metrics = _clip_metrics(ratio, adv, mask, eps_low, eps_high)
    metrics["approx_kl_old"] = approx_kl(logp, old_logp, mask)
    return -surrogate, metrics


# ----------------------------------------------------------------------------------------------
# Policy losses. Each returns (scalar loss, metrics of detached scalars).
# ----------------------------------------------------------------------------------------------


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps: float = 0.2,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimatorName = "k3",
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """GRPO (DeepSeekMath): PPO-clip per token, mean over each sequence's tokens, then over sequences.

    ``L = 1/B sum_i 1/|o_i| sum_t [ -min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i) + beta k3_it ]``

    Example:
        >>> lp = torch.zeros(1, 2); mask = torch.ones(1, 2)
        >>> loss, metrics = grpo_loss(lp, lp, torch.tensor([1.0]), mask)
        >>> loss.item(), metrics["clip_fraction"].item()
        (-1.0, 0.0)
    """
    per_token, metrics = _ppo_clip_per_token(logp, old_logp, advantages, loss_mask, eps, eps, token_weights)
    kl, kl_metrics = kl_penalty(logp, ref_logp, beta, loss_mask, kl_estimator)
    return seq_mean_token_mean(per_token + kl, loss_mask), metrics | kl_metrics


def dr_grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    max_len: int,
    eps: float = 0.2,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimatorName = "k3",
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Dr. GRPO: the GRPO surrogate summed over tokens and divided by a constant ``B * max_len``.

    ``L = 1/(B L_max) sum_i sum_t [ -min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i) + beta k3_it ]``

    Pair it with ``group_advantages(..., normalize_std=False)``; ``max_len`` is the generation
    budget (a constant, so long and short answers weigh per token the same).
    """
    per_token, metrics = _ppo_clip_per_token(logp, old_logp, advantages, loss_mask, eps, eps, token_weights)
    kl, kl_metrics = kl_penalty(logp, ref_logp, beta, loss_mask, kl_estimator)
    return token_sum_over_constant(per_token + kl, loss_mask, max_len), metrics | kl_metrics


def dapo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimatorName = "k3",
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """DAPO: clip-higher (``eps_high > eps_low``) and a token-level mean over all tokens of the batch.

    ``L = 1/sum_i |o_i| sum_i sum_t [ -min(r_it A_i, clip(r_it, 1-eps_low, 1+eps_high) A_i) + beta k3_it ]``
    """
    per_token, metrics = _ppo_clip_per_token(
        logp, old_logp, advantages, loss_mask, eps_low, eps_high, token_weights
    )
    kl, kl_metrics = kl_penalty(logp, ref_logp, beta, loss_mask, kl_estimator)
    return masked_mean(per_token + kl, loss_mask), metrics | kl_metrics


def gspo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    ref_logp: Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: KLEstimatorName = "k3",
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """GSPO: one importance ratio per sequence, the geometric mean of its token ratios.

    ``s_i = exp(1/|o_i| sum_t (logp_it - old_logp_it))``
    ``L = 1/B sum_i -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i)  [+ beta * seq-mean-token-mean k3]``

    ``advantages`` must be per sequence (``[B]``). The tiny default eps (3e-4 / 4e-4) are the
    paper's: a sequence ratio moves far less than a token ratio.
    """
    if advantages.dim() != 1:
        raise ValueError("gspo_loss needs one advantage per sequence ([B])")
    mask = loss_mask.to(logp.dtype)
    token_count = mask.sum(dim=-1).clamp(min=1)
    seq_ratio = torch.exp(_masked_log_ratio(logp, old_logp, mask).sum(dim=-1) / token_count)
    clipped_ratio = torch.clamp(seq_ratio, 1 - eps_low, 1 + eps_high)
    per_sequence = -torch.minimum(seq_ratio * advantages, clipped_ratio * advantages)
    if token_weights is not None:  # one weight per sequence: the mean of its tokens' weights
        per_sequence = per_sequence * (token_weights.detach() * mask).sum(dim=-1) / token_count
    kl, kl_metrics = kl_penalty(logp, ref_logp, beta, loss_mask, kl_estimator)
    loss = per_sequence.mean() + (seq_mean_token_mean(kl, loss_mask) if beta else 0.0)
    has_tokens = (loss_mask.sum(dim=-1) > 0).float().unsqueeze(-1)
    # GSPO's clip fraction and mean ratio count sequences, not tokens.
    metrics = _clip_metrics(seq_ratio.unsqueeze(-1), advantages.unsqueeze(-1), has_tokens, eps_low, eps_high)
    metrics["approx_kl_old"] = approx_kl(logp, old_logp, loss_mask)
    return loss, metrics | kl_metrics


def policy_loss(
    variant: LossVariant,
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
    """Dispatch to one of the losses above by name, with each variant's default clip range.

    ``eps_low``/``eps_high`` default per variant (grpo/dr_grpo: 0.2/0.2, dapo: 0.2/0.28,
    gspo: 3e-4/4e-4); grpo and dr_grpo use a symmetric ``eps_low`` (``eps_high`` must match or be None).
    ``max_len`` is required for dr_grpo. Metrics: ``clip_fraction``, ``ratio_mean``,
    ``approx_kl_old`` and, when ``beta > 0``, ``kl``; all detached scalar tensors.

    Example:
        >>> lp = torch.zeros(2, 3); mask = torch.ones(2, 3)
        >>> loss, metrics = policy_loss("dapo", lp, lp, torch.tensor([1.0, -1.0]), mask)
        >>> loss.item(), sorted(metrics)
        (0.0, ['approx_kl_old', 'clip_fraction', 'ratio_mean'])
    """
    common = {
        "ref_logp": ref_logp,
        "beta": beta,
        "kl_estimator": kl_estimator,
        "token_weights": token_weights,
    }
    if variant in ("grpo", "dr_grpo"):
        eps = 0.2 if eps_low is None else eps_low
        if eps_high is not None and eps_high != eps:
            raise ValueError(f"{variant} clips symmetrically; use variant='dapo' for eps_high != eps_low")
        if variant == "grpo":
            return grpo_loss(logp, old_logp, advantages, loss_mask, eps=eps, **common)
        if max_len is None:
            raise ValueError("dr_grpo needs max_len (the constant normaliser: the generation budget)")
        return dr_grpo_loss(logp, old_logp, advantages, loss_mask, max_len=max_len, eps=eps, **common)
    if variant == "dapo":
        low, high = (0.2 if eps_low is None else eps_low), (0.28 if eps_high is None else eps_high)
        return dapo_loss(logp, old_logp, advantages, loss_mask, eps_low=low, eps_high=high, **common)
    if variant == "gspo":
        low, high = (3e-4 if eps_low is None else eps_low), (4e-4 if eps_high is None else eps_high)
        return gspo_loss(logp, old_logp, advantages, loss_mask, eps_low=low, eps_high=high, **common)
    raise ValueError(f"unknown loss variant {variant!r}; expected one of grpo, dr_grpo, dapo, gspo")
