"""One GRPO step, top to bottom: rollout -> advantages -> micro-batched loss -> optimizer step -> weight sync.

:func:`train_step` is the whole step; read it first. Its pieces, in order:

1. :func:`~rlf_trainer.collect.collect` plays ``prompts_per_step`` (this process's share) x
   ``group_size`` episodes with the policy, lockstep or async (``rollout.mode``); with
   ``rollout.overlap`` the next step's batch is already being collected while this one trains
   (:class:`~rlf_trainer.collect.Prefetch`, staleness 1).
2. :func:`fill_batch` applies DAPO's dynamic sampling: groups without any advantage are dropped
   and new prompts are rolled out (``algorithm.max_refill_rounds``) until the batch is full.
3. :func:`batch_advantages`: per-turn env rewards -> one advantage per token
   (:mod:`rlf_trainer.advantages`); episodes flagged ``sim_error`` leave their group's baseline.
4. :func:`update`: the kept episodes in ``optim.gradient_accumulation_steps`` micro-batches; each
   runs :func:`micro_batch_loss` (the one place every loss variant, the KL penalty and the
   truncated importance weights meet) and a backward; then one clipped optimizer step.
5. ``parts.sync_weights()`` pushes the new weights to a vLLM engine (a no-op for the HF policy).

The trainer (:mod:`rlf_trainer.trainer`) builds :class:`~rlf_trainer.collect.StepParts` once and
keeps the plumbing: setup, checkpoints, logging, evaluation.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch

from rlf_trainer.advantages import spread_over_tokens, turn_advantages
from rlf_trainer.collect import Collected, Prefetch, StepParts, collect, play, sampling_params
from rlf_trainer.distributed import any_rank
from rlf_trainer.losses import (
    approx_kl,
    policy_loss,
    selective_log_softmax,
    token_entropy,
    truncated_importance_weights,
)
from rlf_trainer.metrics import rollout_metrics
from rlf_trainer.rollout_batch import RolloutBatch

_ENTROPY_CHUNK = 1024  # token rows per entropy chunk: bounds the [rows, vocab] softmax


# --------------------------------------------------------------------------------------------- 2, 3
def trainable(parts: StepParts, batch: RolloutBatch) -> list[bool]:
    """Per episode: False where its user simulator failed and ``rollout.drop_sim_errors`` is on."""
    drop = parts.config.rollout.drop_sim_errors
    return [not (drop and s.sim_error) for s in batch.stats]


def batch_advantages(parts: StepParts, batch: RolloutBatch) -> tuple[torch.Tensor, list[list[float]]]:
    """``[N, T]`` token advantages of ``batch`` and the per-turn values they came from."""
    algo = parts.config.algorithm
    normalize = algo.normalize_std if algo.normalize_std is not None else algo.loss != "dr_grpo"
    valid = trainable(parts, batch)
    per_turn = turn_advantages(
        batch.turn_rewards,
        parts.group_size,
        mode=algo.turn_rewards,
        discount=algo.turn_discount,
        normalize_std=normalize,
        valid=valid,
    )
    return spread_over_tokens(per_turn, batch.turn_spans, batch.loss_mask.shape[1]), per_turn


def _groups_with_signal(per_turn: list[list[float]], group_size: int) -> list[int]:
    """Groups with at least one nonzero advantage (the others carry no gradient at all)."""
    return [
        g
        for g in range(len(per_turn) // group_size)
        if any(abs(v) > 1e-12 for episode in per_turn[g * group_size : (g + 1) * group_size] for v in episode)
    ]


def fill_batch(
    parts: StepParts, step: int, first: RolloutBatch
) -> tuple[RolloutBatch, list[int], dict[str, float]]:
    """The batch to train on, the rows to keep, and what dynamic sampling did.

    Without ``algorithm.dynamic_sampling`` every episode is kept (but flagged ``sim_error`` ones).
    With it, groups without any nonzero advantage are dropped (DAPO) and, for up to
    ``algorithm.max_refill_rounds`` rounds, new prompts are rolled out and their groups with
    signal take the empty places, so the update sees a full batch whenever the rounds allow.
    """
    algo, size = parts.config.algorithm, parts.group_size
    num_groups = len(first) // size
    _, per_turn = batch_advantages(parts, first)
    with_signal = _groups_with_signal(per_turn, size)
    info = {"groups/zero_variance": 1.0 - len(with_signal) / max(1, num_groups), "refill_rounds": 0.0}
    batch = first
    if algo.dynamic_sampling:
        kept = [first.select(_rows(with_signal, size))] if with_signal else []
        have, rounds = len(with_signal), 0
        # Every rank plays as many rounds as the neediest one (a sharded model's forward is a collective).
        while rounds < algo.max_refill_rounds and any_rank(parts.accelerator, have < num_groups):
            rounds += 1
            extra = collect(parts, step, refill_round=rounds).batch
            useful = _groups_with_signal(batch_advantages(parts, extra)[1], size)[: num_groups - have]
            if useful:
                kept.append(extra.select(_rows(useful, size)))
                have += len(useful)
        info["refill_rounds"] = float(rounds)
        info["groups/refilled"] = float(have - len(with_signal))
        if not kept:  # no signal anywhere on this process: the update runs with weight 0
            return first, [], info
        batch = RolloutBatch.concat(kept, int(parts.policy.tokenizer.pad_token_id or 0))
    keep = [i for i, ok in enumerate(trainable(parts, batch)) if ok]
    info["sim_errors_dropped"] = float(len(batch) - len(keep))
    return batch, keep, info


def _rows(groups: list[int], size: int) -> list[int]:
    return [g * size + j for g in groups for j in range(size)]


# --------------------------------------------------------------------------------------------- 4
def micro_batch_loss(
    parts: StepParts, micro: RolloutBatch, advantages: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward pass, token log-probs, and the configured loss of one micro-batch (``advantages`` ``[n, T]``)."""
    cfg = parts.config
    algo = cfg.algorithm
    targets, mask = micro.input_ids[:, 1:], micro.loss_mask[:, 1:].float()
    logits = parts.model(
        input_ids=micro.input_ids, attention_mask=micro.attention_mask, use_cache=False
    ).logits
    logits = logits[:, :-1]
    # Temperature 1: the policy records raw logprobs, whatever temperature it sampled with.
    logp = selective_log_softmax(logits, targets)
    sampler_logp = micro.old_logprobs[:, 1:]
    recompute = algo.old_logprobs == "recompute"
    old_logp = logp.detach() if recompute else sampler_logp
    weights, tis_metrics = None, {}
    if cfg.tis_cap > 0:
        weights, tis_metrics = truncated_importance_weights(logp, sampler_logp, mask, cfg.tis_cap)
    adv = advantages[:, 1:]
    if algo.loss == "gspo":  # one advantage per sequence: every token of an episode carries the same
        adv = (adv * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    loss, loss_metrics = policy_loss(
        algo.loss,
        logp,
        old_logp,
        adv,
        mask,
        eps_low=algo.clip_eps_low,
        eps_high=algo.clip_eps_high,
        max_len=cfg.rollout.max_total_tokens,
        ref_logp=reference_logprobs(parts, micro, targets) if algo.beta > 0 else None,
        beta=algo.beta,
        kl_estimator=algo.kl_estimator,
        token_weights=weights,
    )
    if recompute:  # pi_old is pi_theta itself: the ratio is 1, nothing is ever clipped
        for constant in ("clip_fraction", "ratio_mean", "approx_kl_old"):
            loss_metrics.pop(constant, None)
    out = {k: float(v) for k, v in (loss_metrics | tis_metrics).items()}
    out["loss"] = float(loss.detach())
    out["sampler_kl"] = float(approx_kl(logp, sampler_logp, mask))
    out["entropy"] = masked_entropy(logits.detach(), mask)
    return loss, out


def reference_logprobs(parts: StepParts, micro: RolloutBatch, targets: torch.Tensor) -> torch.Tensor:
    """Token log-probs of the reference model: a frozen copy, or the LoRA base with adapters off."""
    inputs = {"input_ids": micro.input_ids, "attention_mask": micro.attention_mask, "use_cache": False}
    with torch.no_grad():
        if parts.ref_model is not None:
            logits = parts.ref_model(**inputs).logits
        else:
            with parts.accelerator.unwrap_model(parts.model).disable_adapter():
                logits = parts.model(**inputs).logits
        return selective_log_softmax(logits[:, :-1], targets)


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> float:
    rows = logits[mask.bool()]
    if rows.shape[0] == 0:
        return 0.0
    total = sum(
        float(token_entropy(rows[i : i + _ENTROPY_CHUNK]).sum())
        for i in range(0, rows.shape[0], _ENTROPY_CHUNK)
    )
    return total / rows.shape[0]


def update(
    parts: StepParts, batch: RolloutBatch, advantages: torch.Tensor, keep: list[int]
) -> dict[str, float]:
    """Micro-batched forward/backward over the kept episodes, then one clipped optimizer step."""
    cfg, acc = parts.config, parts.accelerator
    # The effective value: a DeepSpeed config or ACCELERATE_GRADIENT_ACCUMULATION_STEPS may override ours.
    steps = acc.gradient_accumulation_steps
    kept_tokens = float(batch.loss_mask[keep, 1:].sum()) if keep else 0.0
    local = torch.tensor([float(len(keep)), kept_tokens], dtype=torch.float64, device=acc.device)
    kept_total, tokens_total = acc.reduce(local, reduction="sum").tolist()
    if kept_total == 0.0:  # no process has an episode with signal: nothing to learn this step
        return {"skipped_update": 1.0, "lr": parts.scheduler.get_last_lr()[0]}
    # DDP averages the processes' gradients; this process's share of the whole batch rescales its
    # weights (which sum to 1 locally) so the update equals one process training on every episode.
    local_share = (
        kept_tokens / max(tokens_total, 1.0) if cfg.algorithm.loss == "dapo" else len(keep) / kept_total
    )
    grad_scale = steps * acc.num_processes * local_share
    sums: dict[str, float] = defaultdict(float)
    grad_norm: float | None = None
    parts.model.train()
    for rows in np.array_split(np.array(keep, dtype=np.int64), steps):
        # Every process runs the same number of forward/backward passes (collectives stay in step);
        # a process with nothing left runs one row with weight 0.
        dummy = len(rows) == 0
        picked = [0] if dummy else rows.tolist()
        micro, adv = batch.select(picked).to(acc.device), advantages[picked].to(acc.device)
        adv = adv[:, : micro.input_ids.shape[1]]
        if dummy:
            weight = 0.0
        elif cfg.algorithm.loss == "dapo":  # token-level mean over the whole batch
            weight = float(micro.loss_mask[:, 1:].sum()) / max(kept_tokens, 1.0)
        else:  # per-sequence means, averaged over the batch's sequences
            weight = len(rows) / len(keep)
        with acc.accumulate(parts.model):
            loss, micro_metrics = micro_batch_loss(parts, micro, adv)
            # accelerate / DeepSpeed divide by the accumulation steps; grad_scale undoes it.
            acc.backward(loss * (weight * grad_scale))
            if acc.sync_gradients and cfg.optim.max_grad_norm > 0:
                norm = acc.clip_grad_norm_(parts.model.parameters(), cfg.optim.max_grad_norm)
                grad_norm = float(norm) if norm is not None else None
            parts.optimizer.step()
            parts.optimizer.zero_grad(set_to_none=True)
        for key, value in micro_metrics.items():
            sums[key] += value * weight
    if not acc.sync_gradients:
        raise RuntimeError(
            "gradient accumulation went out of step with the micro-batches: an optimizer step must "
            "be exactly gradient_accumulation_steps micro-batches"
        )
    out = dict(sums) | {"lr": parts.scheduler.get_last_lr()[0]}
    parts.scheduler.step()
    if grad_norm is not None:
        out["grad_norm"] = grad_norm
    return out


# --------------------------------------------------------------------------------------------- the step
def train_step(
    parts: StepParts, step: int, prefetch: Prefetch | None = None, *, prefetch_next: bool = False
) -> tuple[RolloutBatch, dict[str, float]]:
    """Step ``step`` (0-based): returns the batch it trained on and its metrics (this process's)."""
    started = time.perf_counter()
    # 1. rollout: prefetched during the previous step (overlap), or now
    collected = (prefetch.take(step) if prefetch else None) or collect(parts, step)
    staleness = parts.weights_version - collected.version
    # 2. dynamic sampling (DAPO): drop groups without signal, refill with new prompts
    batch, keep, fill_info = fill_batch(parts, step, collected.batch)
    # overlap: the next batch is sampled by the current weights while this one trains
    if prefetch is not None and prefetch_next:
        prefetch.start(parts, step + 1)
    # 3. advantages, one per token
    advantages, _ = batch_advantages(parts, batch)
    # 4. micro-batched loss and one optimizer step
    train_started = time.perf_counter()
    metrics = update(parts, batch, advantages, keep)
    train_s = time.perf_counter() - train_started
    # 5. the engine gets the new weights (after the in-flight rollout: it must be idle)
    sync_started = time.perf_counter()
    if prefetch is not None:
        prefetch.join()
    parts.sync_weights()
    parts.weights_version += 1
    metrics["time/sync"] = time.perf_counter() - sync_started

    metrics |= rollout_metrics(batch.stats) | fill_info
    metrics["kept_episodes"] = float(len(keep))
    metrics["rollout/staleness"] = float(staleness)
    metrics["time/generate"] = collected.batch.timings["generate"]
    metrics["time/tools"] = collected.batch.timings["tools+reward"]  # env steps: tool calls + rewards
    metrics["time/tokenize"] = collected.batch.timings["tokenize"]
    metrics["time/rollout"] = collected.batch.timings.get("total", 0.0)
    metrics["time/train"] = train_s
    step_s = time.perf_counter() - started
    metrics["time/step"] = step_s
    metrics["samples/s"] = len(batch) * parts.accelerator.num_processes / step_s
    return batch, metrics


__all__ = [
    "Collected",
    "Prefetch",
    "StepParts",
    "batch_advantages",
    "collect",
    "fill_batch",
    "micro_batch_loss",
    "play",
    "sampling_params",
    "train_step",
    "trainable",
    "update",
]
