"""One GRPO step, top to bottom: rollout -> advantages -> optimizer steps -> weight sync.

:func:`train_step` is the whole step; read it first. Its pieces, in order:

1. :func:`~rlf_trainer.collect.collect` plays ``prompts_per_step`` (this process's share) x
   ``group_size`` episodes with the policy, lockstep or async (``rollout.mode``); with
   ``rollout.overlap`` the next step's batch is already being collected while this one trains
   (:class:`~rlf_trainer.collect.Prefetch`, staleness 1). Every sample's seed comes from
   :func:`rlf_trainer.seeds.sample_seed`.
2. :func:`fill_batch`: the advantages of each rollout, computed once (:func:`episode_advantages`:
   per-turn env rewards, DAPO's overlong penalty, group baselines without ``sim_error`` episodes);
   with ``algorithm.dynamic_sampling`` groups without any advantage are dropped and new prompts are
   rolled out (``algorithm.max_refill_rounds``) until the batch is full.
3. :func:`update`: ``algorithm.num_iterations`` passes over the kept episodes, each pass
   ``algorithm.mini_batches`` optimizer steps, each step ``optim.gradient_accumulation_steps``
   micro-batches. Episodes whose advantages are all 0 count in the denominators but are not
   forwarded (:func:`with_signal`). pi_old is frozen before the first pass (:func:`frozen_old_logprobs`). Each
   micro-batch runs :func:`micro_batch_loss`: :func:`~rlf_trainer.losses.loss_terms` per token,
   then :func:`~rlf_trainer.losses.aggregate` with the normaliser of its optimizer step, counted
   once over every micro-batch of every process (:func:`step_normalisers`), so the micro-batch
   losses add up to the loss of the whole mini-batch.
4. :func:`sync_weights` pushes the new weights to a vLLM engine (nothing to do for the HF policy).

The trainer (:mod:`rlf_trainer.trainer`) builds :class:`~rlf_trainer.collect.StepParts` once
(:mod:`rlf_trainer.build`) and keeps the plumbing: checkpoints, logging, evaluation.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch

from rlf_trainer.advantages import overlong_penalty, spread_over_tokens, turn_advantages
from rlf_trainer.collect import Collected, Prefetch, StepParts, collect, play, sampling_params
from rlf_trainer.distributed import any_rank
from rlf_trainer.forward import full_parameters, masked_entropy, reference_logprobs, token_logprobs
from rlf_trainer.losses import (
    LossSpec,
    Normaliser,
    aggregate,
    approx_kl,
    loss_terms,
    truncated_importance_weights,
)
from rlf_trainer.metrics import rollout_metrics
from rlf_trainer.rollout_batch import RolloutBatch

# Diagnostics that are constant by construction when pi_old is the model itself at its one update
# (the loss is then -mean(A) = 0 plus the KL penalty, if any).
_RATIO_ONE_METRICS = ("clip_fraction", "ratio_mean", "approx_kl_old", "loss")


# --------------------------------------------------------------------------------------------- 2
def trainable(parts: StepParts, batch: RolloutBatch) -> list[bool]:
    """Per episode: False where its user simulator failed and ``rollout.drop_sim_errors`` is on."""
    drop = parts.config.rollout.drop_sim_errors
    return [not (drop and s.sim_error) for s in batch.stats]


def episode_advantages(parts: StepParts, batch: RolloutBatch) -> list[list[float]]:
    """One advantage per generated turn of every episode of ``batch`` (computed once per rollout)."""
    algo, max_new = parts.config.algorithm, parts.config.rollout.max_new_tokens
    rewards = [list(r) for r in batch.turn_rewards]
    if algo.overlong_buffer > 0:  # DAPO: a ramp to -factor over the last `buffer` tokens of a turn
        longest = torch.tensor([max((e - s for s, e in spans), default=0) for spans in batch.turn_spans])
        penalty = algo.overlong_penalty_factor * overlong_penalty(longest, max_new, algo.overlong_buffer)
        for episode, extra in zip(rewards, penalty.tolist(), strict=True):
            if episode:
                episode[-1] += extra
    return turn_advantages(
        rewards,
        parts.group_size,
        mode=algo.turn_rewards,
        discount=algo.turn_discount,
        normalize_std=algo.normalize_std if algo.normalize_std is not None else algo.loss != "dr_grpo",
        valid=trainable(parts, batch),
    )


def _groups_with_signal(per_turn: list[list[float]], group_size: int) -> list[int]:
    """Groups with at least one nonzero advantage (the others carry no gradient at all)."""
    return [
        g
        for g in range(len(per_turn) // group_size)
        if any(abs(v) > 1e-12 for episode in per_turn[g * group_size : (g + 1) * group_size] for v in episode)
    ]


def _rows(groups: list[int], size: int) -> list[int]:
    return [g * size + j for g in groups for j in range(size)]


def fill_batch(
    parts: StepParts, step: int, first: RolloutBatch
) -> tuple[RolloutBatch, list[list[float]], list[int], dict[str, float]]:
    """The batch to train on, its per-turn advantages, the rows to keep, and what dynamic sampling did.

    Without ``algorithm.dynamic_sampling`` every episode is kept (but flagged ``sim_error`` ones).
    With it, groups without any nonzero advantage are dropped (DAPO) and, for up to
    ``algorithm.max_refill_rounds`` rounds, new prompts are rolled out and their groups with
    signal take the empty places. Advantages are group-relative, so a kept group keeps its values.
    """
    algo, size = parts.config.algorithm, parts.group_size
    num_groups = len(first) // size
    per_turn = episode_advantages(parts, first)
    with_signal = _groups_with_signal(per_turn, size)
    info = {"groups/zero_variance": 1.0 - len(with_signal) / max(1, num_groups), "refill_rounds": 0.0}
    batch = first
    if algo.dynamic_sampling:
        kept = [(first.select(_rows(with_signal, size)), [per_turn[i] for i in _rows(with_signal, size)])]
        have, rounds = len(with_signal), 0
        # Every rank plays as many rounds as the neediest one (a sharded model's forward is a collective).
        while rounds < algo.max_refill_rounds and any_rank(parts.accelerator, have < num_groups):
            rounds += 1
            extra = collect(parts, step, refill_round=rounds).batch
            extra_turns = episode_advantages(parts, extra)
            useful = _groups_with_signal(extra_turns, size)[: num_groups - have]
            if useful:
                kept.append(
                    (extra.select(_rows(useful, size)), [extra_turns[i] for i in _rows(useful, size)])
                )
                have += len(useful)
        info["refill_rounds"] = float(rounds)
        info["groups/refilled"] = float(have - len(with_signal))
        if have == 0:  # no signal anywhere on this process: the update runs with weight 0
            return first, per_turn, [], info
        kept = [k for k in kept if len(k[0])]
        batch = RolloutBatch.concat([b for b, _ in kept], int(parts.policy.tokenizer.pad_token_id or 0))
        per_turn = [episode for _, turns in kept for episode in turns]
    keep = [i for i, ok in enumerate(trainable(parts, batch)) if ok]
    info["sim_errors_dropped"] = float(len(batch) - len(keep))
    return batch, per_turn, keep, info


# --------------------------------------------------------------------------------------------- 3
def _single_pass(parts: StepParts) -> bool:
    """One optimizer step on a batch with pi_old recomputed: the ratio is 1, nothing is clipped."""
    algo = parts.config.algorithm
    return algo.num_iterations == 1 and algo.mini_batches == 1 and algo.old_logprobs == "recompute"


def frozen_old_logprobs(parts: StepParts, batch: RolloutBatch, keep: list[int]) -> torch.Tensor | None:
    """pi_old for every pass: the sampler's logprobs (``old_logprobs=rollout``), or, when the batch
    gets more than one optimizer step, the model's own before the first (no gradient); None when
    the single step can take them from its own forward pass."""
    if parts.config.algorithm.old_logprobs == "rollout":
        return batch.old_logprobs[:, 1:].clone()
    if _single_pass(parts):
        return None
    acc, steps = parts.accelerator, parts.accelerator.gradient_accumulation_steps
    frozen = torch.zeros_like(batch.old_logprobs[:, 1:])
    with torch.no_grad():
        for rows in np.array_split(np.array(keep, dtype=np.int64), steps):
            if len(rows):
                micro = batch.select(rows.tolist()).to(acc.device)
                frozen[rows, : micro.input_ids.shape[1] - 1] = token_logprobs(parts, micro)[1].float().cpu()
    return frozen


def micro_batch_loss(
    parts: StepParts,
    micro: RolloutBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    norm: Normaliser,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Forward pass and this micro-batch's share of its optimizer step's loss (``advantages`` ``[n, T]``)."""
    cfg, algo = parts.config, parts.config.algorithm
    mask = micro.loss_mask[:, 1:].float()
    logits, logp = token_logprobs(parts, micro)
    sampler_logp = micro.old_logprobs[:, 1:]
    weights, tis_metrics = None, {}
    if cfg.tis_cap > 0:
        weights, tis_metrics = truncated_importance_weights(logp, sampler_logp, mask, cfg.tis_cap)
    spec = LossSpec(
        algo.loss,
        algo.clip_eps_low,
        algo.clip_eps_high,
        algo.beta,
        algo.kl_estimator,
        cfg.rollout.max_total_tokens,
    )
    ref_logp = reference_logprobs(parts, micro) if algo.beta > 0 else None
    old = logp.detach() if old_logp is None else old_logp
    terms, kl, loss_metrics = loss_terms(
        spec, logp, old, advantages[:, 1:], mask, ref_logp=ref_logp, token_weights=weights
    )
    loss = aggregate(algo.loss, terms, kl, mask, norm)
    out = {k: float(v) for k, v in (loss_metrics | tis_metrics).items()}
    out["loss"] = float(loss.detach())  # this micro-batch's share of its optimizer step's loss
    if cfg.rollout.overlap or not samples_with_trained_model(parts):  # else the KL is ~1e-9
        out["sampler_kl"] = float(approx_kl(logp, sampler_logp, mask))
    out["entropy"] = masked_entropy(logits.detach(), mask)
    if _single_pass(parts):
        for constant in _RATIO_ONE_METRICS:
            if constant != "loss" or algo.beta == 0:  # with a KL penalty the loss still moves
                out.pop(constant, None)
    return loss, out


def samples_with_trained_model(parts: StepParts) -> bool:
    """True when the policy generates with the very module being trained (the HF backend)."""
    return getattr(parts.policy, "model", None) is parts.accelerator.unwrap_model(parts.model)


def with_signal(parts: StepParts, advantages: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` add to the gradient: those with a non-zero advantage on some token, or
    all of them when a KL penalty (``beta > 0``) pulls every episode. Early in a run most groups
    have all-equal rewards; not forwarding their episodes changes no weight and saves their
    forward and backward passes."""
    if parts.config.algorithm.beta > 0 or not len(rows):
        return np.ones(len(rows), dtype=bool)
    return (advantages[torch.as_tensor(rows)] != 0).any(dim=1).numpy()


def step_normalisers(parts: StepParts, batch: RolloutBatch, minis: list[np.ndarray]) -> list[Normaliser]:
    """Sequences and trained tokens of each optimizer step, summed over all processes (one reduce)."""
    acc = parts.accelerator
    counts = torch.tensor(
        [
            [float(len(rows)), float(batch.loss_mask[rows.tolist(), 1:].sum()) if len(rows) else 0.0]
            for rows in minis
        ],
        device=acc.device,
    )
    totals = acc.reduce(counts, reduction="sum").cpu().tolist()
    max_len = parts.config.rollout.max_total_tokens
    return [Normaliser(sequences, tokens, max_len) for sequences, tokens in totals]


def metric_weight(key: str, micro: RolloutBatch, norm: Normaliser, processes: int, variant: str) -> float:
    """How much a micro-batch's metric counts in its optimizer step's value over every process.

    Token means (KL, entropy, ratios) weigh by the micro-batch's share of the step's trained tokens,
    GSPO's per-sequence clip statistics by its share of the sequences; ``loss`` is already this
    micro-batch's share. The trainer averages the processes' values, hence the factor ``processes``:
    the logged figure is the one a single process training on every episode would log.
    """
    if key == "loss":
        return float(processes)
    if variant == "gspo" and key in ("clip_fraction", "ratio_mean"):
        return processes * len(micro) / max(norm.sequences, 1.0)
    return processes * float(micro.loss_mask[:, 1:].sum()) / max(norm.tokens, 1.0)


def optimizer_step(
    parts: StepParts,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    rows: np.ndarray,
    old_logp: torch.Tensor | None,
    norm: Normaliser,
    signal_norm: Normaliser,
) -> tuple[dict[str, float], float | None]:
    """``gradient_accumulation_steps`` micro-batches of ``rows``, then one clipped optimizer step.

    ``norm`` holds the loss denominators of the step; ``signal_norm`` those of the episodes
    actually forwarded (``rows``, over every process), which weigh the metrics.
    """
    acc, cfg = parts.accelerator, parts.config
    steps = acc.gradient_accumulation_steps
    sums: dict[str, float] = defaultdict(float)
    grad_norm: float | None = None
    for micro_rows in np.array_split(rows, steps):
        # Every process runs the same number of forward/backward passes (collectives stay in step);
        # a process with nothing left runs the first 2 tokens of a row, with a loss that counts 0
        # (the optimizer still steps on the zero gradient, as it would on a batch without signal).
        dummy = len(micro_rows) == 0
        picked = [0] if dummy else micro_rows.tolist()
        micro = batch.select(picked)
        micro = (micro.first_tokens(2) if dummy else micro).to(acc.device)
        adv = advantages[picked, : micro.input_ids.shape[1]].to(acc.device)
        old = None if old_logp is None else old_logp[picked, : micro.input_ids.shape[1] - 1].to(acc.device)
        with acc.accumulate(parts.model):
            loss, micro_metrics = micro_batch_loss(parts, micro, adv, old, norm)
            # Accelerate divides by the accumulation steps and DDP averages over processes; the
            # normaliser already counts both, so undo them.
            scale = 0.0 if dummy else float(steps * acc.num_processes)
            acc.backward(loss * scale)
            if acc.sync_gradients and cfg.optim.max_grad_norm > 0:
                norm_value = acc.clip_grad_norm_(parts.model.parameters(), cfg.optim.max_grad_norm)
                grad_norm = float(norm_value) if norm_value is not None else None
            parts.optimizer.step()
            parts.optimizer.zero_grad(set_to_none=True)
        if not dummy:
            for key, value in micro_metrics.items():
                sums[key] += value * metric_weight(
                    key, micro, signal_norm, acc.num_processes, cfg.algorithm.loss
                )
    if not acc.sync_gradients:
        raise RuntimeError(
            "gradient accumulation went out of step with the micro-batches: an optimizer step must "
            "be exactly gradient_accumulation_steps micro-batches"
        )
    return dict(sums), grad_norm


def update(
    parts: StepParts, batch: RolloutBatch, advantages: torch.Tensor, keep: list[int]
) -> dict[str, float]:
    """``num_iterations`` passes x ``mini_batches`` optimizer steps over the kept episodes.

    Metrics are the mean over the optimizer steps; ``grad_norm`` is the last step's. The LR
    scheduler steps once per GRPO step, whatever the number of optimizer steps.
    """
    acc, algo = parts.accelerator, parts.config.algorithm
    kept_total = acc.reduce(torch.tensor(float(len(keep)), device=acc.device), reduction="sum")
    if float(kept_total) == 0.0:  # no process has an episode with signal: nothing to learn this step
        return {"skipped_update": 1.0, "lr": parts.scheduler.get_last_lr()[0]}
    kept_minis = np.array_split(np.array(keep, dtype=np.int64), algo.mini_batches)
    # The loss denominators count every kept episode, but only episodes with signal are forwarded
    # (the others add exactly 0 to the gradient); their counts weigh the metrics. One reduce for both.
    minis = [rows[with_signal(parts, advantages, rows)] for rows in kept_minis]
    counted = step_normalisers(parts, batch, [*kept_minis, *minis])
    norms, signal_norms = counted[: len(minis)], counted[len(minis) :]
    old_logp = frozen_old_logprobs(parts, batch, np.concatenate(minis).tolist())
    parts.model.train()
    sums: dict[str, float] = defaultdict(float)
    grad_norm: float | None = None
    for _ in range(algo.num_iterations):
        for rows, norm, signal_norm in zip(minis, norms, signal_norms, strict=True):
            metrics, grad_norm = optimizer_step(parts, batch, advantages, rows, old_logp, norm, signal_norm)
            for key, value in metrics.items():
                sums[key] += value / (algo.num_iterations * algo.mini_batches)
    out = dict(sums) | {"lr": parts.scheduler.get_last_lr()[0]}
    out["trained_share"] = sum(n.sequences for n in signal_norms) / max(sum(n.sequences for n in norms), 1.0)
    parts.scheduler.step()
    if grad_norm is not None:
        out["grad_norm"] = grad_norm
    return out


# --------------------------------------------------------------------------------------------- 4
def sync_weights(parts: StepParts) -> None:
    """Give a separate engine (vLLM) the current weights; the HF policy samples with the model itself."""
    if parts.config.policy.backend == "vllm":
        with full_parameters(parts.accelerator, parts.model):
            parts.policy.update_weights(parts.accelerator.unwrap_model(parts.model))


# --------------------------------------------------------------------------------------------- the step
def train_step(
    parts: StepParts, step: int, prefetch: Prefetch | None = None, *, prefetch_next: bool = False
) -> tuple[RolloutBatch, dict[str, float]]:
    """Step ``step`` (0-based): returns the batch it trained on and its metrics (this process's)."""
    started = time.perf_counter()
    # 1. rollout: prefetched during the previous step (overlap), or now
    collected = (prefetch.take(step) if prefetch else None) or collect(parts, step)
    # 2. advantages, once per rollout; dynamic sampling (DAPO) drops groups without signal and refills
    batch, per_turn, keep, fill_info = fill_batch(parts, step, collected.batch)
    advantages = spread_over_tokens(per_turn, batch.turn_spans, batch.loss_mask.shape[1])
    # overlap: the next batch is sampled by the current weights while this one trains
    if prefetch is not None and prefetch_next:
        prefetch.start(parts, step + 1)
    # 3. num_iterations x mini_batches optimizer steps
    train_started = time.perf_counter()
    metrics = update(parts, batch, advantages, keep)
    metrics["time/train"] = time.perf_counter() - train_started
    # 4. the engine gets the new weights (after the in-flight rollout: it must be idle)
    sync_started = time.perf_counter()
    if prefetch is not None:
        prefetch.join()
    sync_weights(parts)
    staleness = parts.weights_version - collected.version
    parts.weights_version += 1
    metrics["time/sync"] = time.perf_counter() - sync_started

    metrics |= rollout_metrics(batch.stats) | fill_info
    metrics["kept_episodes"] = float(len(keep))
    if parts.config.rollout.overlap:  # 0 by construction without overlap
        metrics["rollout/staleness"] = float(staleness)
    timings = collected.batch.timings
    metrics["time/generate"] = timings["generate"]
    metrics["time/tools"] = timings["tools+reward"]  # env steps: tool calls + rewards
    metrics["time/tokenize"] = timings["tokenize"]
    metrics["time/rollout"] = timings.get("total", 0.0)
    metrics["time/step"] = time.perf_counter() - started
    metrics["samples/s"] = len(batch) * parts.accelerator.num_processes / metrics["time/step"]
    return batch, metrics


__all__ = [
    "Collected",
    "Prefetch",
    "StepParts",
    "collect",
    "episode_advantages",
    "fill_batch",
    "micro_batch_loss",
    "play",
    "sampling_params",
    "sync_weights",
    "train_step",
    "trainable",
    "update",
]
