"""One GRPO step, top to bottom: rollout -> advantages -> optimizer steps -> weight sync.

:func:`train_step` is the whole step and comes first; every function after it is one of its
parts, in the order the step calls them:

1. :func:`~rlf_trainer.rollout.collect.collect` plays ``prompts_per_step`` (this process's share)
   x ``group_size`` episodes with the policy, lockstep or async (``rollout.mode``); with
   ``rollout.overlap`` the next step's batch is already being collected while this one trains
   (:class:`~rlf_trainer.rollout.collect.Prefetch`, staleness 1).
   With ``algorithm.guidance`` (:func:`~rlf_trainer.algorithms.guided.guide`), a demonstrator plays the task of each group whose
   samples all failed and its episode replaces the group's worst sample (LUFFY's mixed groups).
2. :func:`fill_batch`: the advantages of each rollout, computed once (:func:`episode_advantages`:
   per-turn env rewards, DAPO's overlong penalty, group baselines without ``sim_error`` episodes);
   with ``algorithm.dynamic_sampling`` groups without any advantage are dropped and new prompts are
   rolled out (``algorithm.max_refill_rounds``) until the batch is full.
3. :func:`update`: ``algorithm.num_iterations`` passes over the kept episodes, each pass
   ``algorithm.mini_batches`` optimizer steps (:func:`optimizer_step`), each of
   ``optim.gradient_accumulation_steps`` micro-batches (:func:`micro_batch_loss`: the per-token
   log-probs, the ratio to pi_old, the clip, the KL penalty, the TIS weight, the aggregation;
   a demonstration's tokens take LUFFY's policy shaping instead of the clipped ratio).
   Episodes whose advantages are all 0 count in the denominators but are not forwarded.
4. :func:`~rlf_trainer.algorithms.optimize.sync_weights` pushes the new weights to a vLLM engine
   or to remote inference servers (``policy.backend: remote``, every ``policy.remote.sync_every``
   steps). Remote samples carry the weights version that drew them; those more than
   ``rollout.max_staleness`` versions old leave the update (:func:`trainable`).

The state is two objects: :class:`~rlf_trainer.rollout.collect.RolloutState` (what playing needs)
and :class:`~rlf_trainer.algorithms.optimize.Learner` (what the update changes). The loss
formulas are pure functions in :mod:`rlf_trainer.algorithms.losses`, each beside its formula.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from rlf_trainer.algorithms.advantages import overlong_penalty, spread_over_tokens, turn_advantages
from rlf_trainer.algorithms.guided import guide, guided_advantage
from rlf_trainer.algorithms.losses import (
    LossSpec,
    Normaliser,
    aggregate,
    approx_kl,
    loss_terms,
    policy_shaping_terms,
    truncated_importance_weights,
)
from rlf_trainer.algorithms.optimize import (
    Learner,
    TokenLogprobs,
    can_share_prefix,
    samples_with_trained_model,
    shares_prefix,
    step_optimizer,
    sync_weights,
    token_logprobs,
)
from rlf_trainer.algorithms.shared_prefix import micro_batch_rows
from rlf_trainer.observe.metrics import rollout_metrics
from rlf_trainer.rollout.batch import RolloutBatch
from rlf_trainer.rollout.collect import Prefetch, RolloutState, collect
from rlf_trainer.rollout.trajectory import EpisodeStats
from rlf_trainer.run.distributed import any_rank

# Diagnostics that are constant by construction when pi_old is the model itself at its one update
# (the loss is then -mean(A) = 0 plus the KL penalty, if any).
_RATIO_ONE_METRICS = ("clip_fraction", "ratio_mean", "approx_kl_old", "loss")
_SAMPLER_KL_ROWS = 4  # episodes measured for sampler_kl when the update forwards none


# --------------------------------------------------------------------------------------------- the step
def train_step(
    rollout: RolloutState,
    learner: Learner,
    step: int,
    prefetch: Prefetch | None = None,
    *,
    prefetch_next: bool = False,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Step ``step`` (0-based): returns the batch it trained on and its metrics (this process's)."""
    started = time.perf_counter()
    # 1. rollout: prefetched during the previous step (overlap), or now
    collected = (prefetch.take(step) if prefetch else None) or collect(rollout, step)
    # guidance: a demonstration replaces one sample of each group whose samples all failed
    guided, guide_info = guide(rollout, step, collected)
    # 2. advantages, once per rollout; dynamic sampling (DAPO) drops groups without signal and refills
    batch, per_turn, keep, fill_info = fill_batch(rollout, step, guided)
    advantages = spread_over_tokens(per_turn, batch.turn_spans, batch.loss_mask.shape[1])
    # overlap: the next batch is sampled by the current weights while this one trains
    if prefetch is not None and prefetch_next:
        prefetch.start(rollout, step + 1)
    # 3. num_iterations x mini_batches optimizer steps
    train_started = time.perf_counter()
    separate_sampler = not samples_with_trained_model(learner, rollout.policy)
    metrics = update(learner, batch, advantages, keep, measure_sampler_kl=separate_sampler)
    metrics["time/train"] = time.perf_counter() - train_started
    # 4. the engine gets the new weights: a colocated one after the in-flight rollout (it must be
    # idle); remote servers while it goes on (their requests in flight finish on the old weights)
    sync_started = time.perf_counter()
    if prefetch is not None and rollout.config.policy.backend != "remote":
        prefetch.join()
    sync_weights(learner, rollout.policy, version=rollout.weights_version + 1)
    staleness = rollout.weights_version - collected.version
    metrics |= staleness_metrics(rollout, batch, keep)  # against the weights this step trained
    rollout.weights_version += 1
    metrics["time/sync"] = time.perf_counter() - sync_started

    # the policy's own episodes: a demonstration's reward is not the policy's
    metrics |= rollout_metrics(own_episodes(batch.stats)) | fill_info | guide_info
    metrics |= guided_advantage(batch.stats, per_turn)
    metrics["kept_episodes"] = float(len(keep))
    metrics["rollout/tokens"] = float(collected.batch.attention_mask.sum())  # this process's sequences
    metrics["rollout/generated_tokens"] = float(collected.batch.loss_mask.sum())
    # the HF policy samples with the trained weights (always 0); tagged samples were counted above
    if separate_sampler and "rollout/dropped_stale" not in metrics:
        metrics["rollout/staleness"] = float(staleness)
    take_policy_metrics = getattr(rollout.policy, "take_metrics", None)
    if callable(take_policy_metrics):  # the remote policy: servers' queue depth, tokens/s, failovers
        metrics |= take_policy_metrics()
    timings = collected.batch.timings
    metrics["time/generate"] = timings["generate"]
    metrics["time/tools"] = timings["tools+reward"]  # env steps: tool calls + rewards
    metrics["time/tokenize"] = timings["tokenize"]
    metrics["time/rollout"] = timings.get("total", 0.0)
    metrics["time/step"] = time.perf_counter() - started
    metrics["samples/s"] = len(batch) * rollout.accelerator.num_processes / metrics["time/step"]
    return batch, metrics


def own_episodes(stats: list[EpisodeStats]) -> list[EpisodeStats]:
    """The episodes the policy sampled itself (demonstrations left out)."""
    return [s for s in stats if not s.demonstration]


# --------------------------------------------------------------------------------------------- 2. advantages
def trainable(rollout: RolloutState, batch: RolloutBatch) -> list[bool]:
    """Per episode: False where its user simulator failed and ``rollout.drop_sim_errors`` is on, or
    where it was sampled more than ``rollout.max_staleness`` versions ago (:func:`too_stale`)."""
    drop = rollout.config.rollout.drop_sim_errors
    return [not (drop and s.sim_error) and not too_stale(rollout, s) for s in batch.stats]


def episode_staleness(rollout: RolloutState, stats: EpisodeStats) -> int | None:
    """Versions between the weights that drew the episode (its oldest turn) and those being trained
    now; None when the policy does not tag its samples (it samples with the current weights)."""
    return None if stats.weights_version is None else rollout.weights_version - stats.weights_version


def too_stale(rollout: RolloutState, stats: EpisodeStats) -> bool:
    lag = episode_staleness(rollout, stats)
    return lag is not None and lag > rollout.config.rollout.max_staleness


def staleness_metrics(rollout: RolloutState, batch: RolloutBatch, keep: list[int]) -> dict[str, float]:
    """For tagged samples: the max and mean staleness of the episodes the update used (never above
    ``rollout.max_staleness``) and how many were dropped as too old; {} without tags."""
    lags = [episode_staleness(rollout, s) for s in batch.stats]
    if all(lag is None for lag in lags):
        return {}
    kept = [lags[i] for i in keep if lags[i] is not None]
    out = {"rollout/dropped_stale": float(sum(too_stale(rollout, s) for s in batch.stats))}
    if kept:
        out["rollout/staleness"] = float(max(kept))
        out["rollout/staleness_mean"] = sum(kept) / len(kept)
    return out


def fill_batch(
    rollout: RolloutState, step: int, first: RolloutBatch
) -> tuple[RolloutBatch, list[list[float]], list[int], dict[str, float]]:
    """The batch to train on, its per-turn advantages, the rows to keep, and what dynamic sampling did.

    Without ``algorithm.dynamic_sampling`` every episode is kept (but flagged ``sim_error`` ones).
    With it, groups without any nonzero advantage are dropped (DAPO) and, for up to
    ``algorithm.max_refill_rounds`` rounds, new prompts are rolled out and their groups with
    signal take the empty places. Advantages are group-relative, so a kept group keeps its values.
    """
    algo, size = rollout.config.algorithm, rollout.group_size
    num_groups = len(first) // size
    per_turn = episode_advantages(rollout, first)
    with_signal = _groups_with_signal(per_turn, size)
    info = {"groups/zero_variance": 1.0 - len(with_signal) / max(1, num_groups), "refill_rounds": 0.0}
    batch = first
    if algo.dynamic_sampling:
        kept = [(first.select(_rows(with_signal, size)), [per_turn[i] for i in _rows(with_signal, size)])]
        have, rounds = len(with_signal), 0
        # Every rank plays as many rounds as the neediest one (a sharded model's forward is a collective).
        while rounds < algo.max_refill_rounds and any_rank(rollout.accelerator, have < num_groups):
            rounds += 1
            extra = collect(rollout, step, refill_round=rounds).batch
            extra_turns = episode_advantages(rollout, extra)
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
        batch = RolloutBatch.concat([b for b, _ in kept], int(rollout.policy.tokenizer.pad_token_id or 0))
        per_turn = [episode for _, turns in kept for episode in turns]
    keep = [i for i, ok in enumerate(trainable(rollout, batch)) if ok]
    info["sim_errors_dropped"] = (
        float(sum(bool(s.sim_error) for s in batch.stats)) if rollout.config.rollout.drop_sim_errors else 0.0
    )
    return batch, per_turn, keep, info


def episode_advantages(rollout: RolloutState, batch: RolloutBatch) -> list[list[float]]:
    """One advantage per generated turn of every episode of ``batch`` (computed once per rollout)."""
    algo, max_new = rollout.config.algorithm, rollout.config.rollout.max_new_tokens
    rewards = [list(r) for r in batch.turn_rewards]
    if algo.overlong_buffer > 0:  # DAPO: a ramp to -factor over the last `buffer` tokens of a turn
        longest = torch.tensor([max((e - s for s, e in spans), default=0) for spans in batch.turn_spans])
        penalty = algo.overlong_penalty_factor * overlong_penalty(longest, max_new, algo.overlong_buffer)
        for episode, extra in zip(rewards, penalty.tolist(), strict=True):
            if episode:
                episode[-1] += extra
    return turn_advantages(
        rewards,
        rollout.group_size,
        mode=algo.turn_rewards,
        discount=algo.turn_discount,
        normalize_std=algo.normalize_std if algo.normalize_std is not None else algo.loss != "dr_grpo",
        valid=trainable(rollout, batch),
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


# --------------------------------------------------------------------------------------------- 3. update
def update(
    learner: Learner,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    keep: list[int],
    *,
    measure_sampler_kl: bool = False,
) -> dict[str, float]:
    """``num_iterations`` passes x ``mini_batches`` optimizer steps over the kept episodes.

    Metrics are the mean over the optimizer steps; ``grad_norm`` is the last step's. The LR
    scheduler steps once per call (once per GRPO step), whatever the number of optimizer steps.
    ``measure_sampler_kl``: log ``sampler_kl`` (the sampler is not the trained module), measured
    on a few episodes without gradient when no episode is forwarded.
    """
    acc, algo = learner.accelerator, learner.config.algorithm
    kept_total = acc.reduce(torch.tensor(float(len(keep)), device=acc.device), reduction="sum")
    if float(kept_total) == 0.0:  # no process has an episode with signal: nothing to learn this step
        out = {"skipped_update": 1.0, "lr": learner.scheduler.get_last_lr()[0]}
        if measure_sampler_kl:
            out["sampler_kl"] = sampler_kl_without_update(learner, batch, list(range(len(batch))))
        return out
    kept_minis = np.array_split(np.array(keep, dtype=np.int64), algo.mini_batches)
    # The loss denominators count every kept episode, but only episodes with signal are forwarded
    # (the others add exactly 0 to the gradient); their counts weigh the metrics. One reduce for both.
    minis = [rows[with_signal(learner, advantages, rows)] for rows in kept_minis]
    counted = step_normalisers(learner, batch, [*kept_minis, *minis])
    norms, signal_norms = counted[: len(minis)], counted[len(minis) :]
    old_logp = frozen_old_logprobs(learner, batch, np.concatenate(minis).tolist())
    learner.model.train()
    sums: dict[str, float] = defaultdict(float)
    grad_norm: float | None = None
    real = forwarded = 0.0
    for _ in range(algo.num_iterations):
        for rows, norm, signal_norm in zip(minis, norms, signal_norms, strict=True):
            metrics, grad_norm, (step_real, step_forwarded) = optimizer_step(
                learner, batch, advantages, rows, old_logp, norm, signal_norm, measure_sampler_kl
            )
            for key, value in metrics.items():
                sums[key] += value / (algo.num_iterations * algo.mini_batches)
            real, forwarded = real + step_real, forwarded + step_forwarded
    out = dict(sums) | {"lr": learner.scheduler.get_last_lr()[0]}
    if forwarded:  # padding: the share of forwarded token positions that are not tokens
        out["update/pad_fraction"] = 1.0 - real / forwarded
        out["update/tokens"] = real  # with gradient, this process (rlf-bench train's FLOPs)
    out["trained_share"] = sum(n.sequences for n in signal_norms) / max(sum(n.sequences for n in norms), 1.0)
    if measure_sampler_kl and "sampler_kl" not in out:  # no process forwarded an episode
        out["sampler_kl"] = sampler_kl_without_update(learner, batch, keep)
    learner.scheduler.step()
    if grad_norm is not None:
        out["grad_norm"] = grad_norm
    return out


def with_signal(learner: Learner, advantages: torch.Tensor, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` add to the gradient: those with a non-zero advantage on some token, or
    all of them when a KL penalty (``beta > 0``) pulls every episode. Early in a run most groups
    have all-equal rewards; not forwarding their episodes changes no weight and saves their
    forward and backward passes."""
    if learner.config.algorithm.beta > 0 or not len(rows):
        return np.ones(len(rows), dtype=bool)
    return (advantages[torch.as_tensor(rows)] != 0).any(dim=1).numpy()


def step_normalisers(learner: Learner, batch: RolloutBatch, minis: list[np.ndarray]) -> list[Normaliser]:
    """Sequences and trained tokens of each optimizer step, summed over all processes (one reduce)."""
    acc = learner.accelerator
    counts = torch.tensor(
        [
            [float(len(rows)), float(batch.loss_mask[rows.tolist(), 1:].sum()) if len(rows) else 0.0]
            for rows in minis
        ],
        device=acc.device,
    )
    totals = acc.reduce(counts, reduction="sum").cpu().tolist()
    max_len = learner.config.rollout.max_total_tokens
    return [Normaliser(sequences, tokens, max_len) for sequences, tokens in totals]


def frozen_old_logprobs(learner: Learner, batch: RolloutBatch, keep: list[int]) -> torch.Tensor | None:
    """pi_old for every pass: the sampler's logprobs (``old_logprobs=rollout``), or, when the batch
    gets more than one optimizer step, the model's own before the first (no gradient); None when
    the single step can take them from its own forward pass."""
    algo, acc = learner.config.algorithm, learner.accelerator
    if algo.old_logprobs == "rollout":
        return batch.old_logprobs[:, 1:].clone()
    if algo.ratio_is_one:
        return None
    frozen = torch.zeros_like(batch.old_logprobs[:, 1:])
    with torch.no_grad():
        for rows in split_micro_batches(learner, batch, np.array(keep, dtype=np.int64)):
            if len(rows):
                micro = batch.select(rows.tolist()).to(acc.device)
                forward = rows_logprobs(learner, learner.model, micro, micro.loss_mask[:, 1:])
                frozen[rows, : micro.input_ids.shape[1] - 1] = forward.logp.cpu()
    return frozen


def optimizer_step(
    learner: Learner,
    batch: RolloutBatch,
    advantages: torch.Tensor,
    rows: np.ndarray,
    old_logp: torch.Tensor | None,
    norm: Normaliser,
    signal_norm: Normaliser,
    measure_sampler_kl: bool,
) -> tuple[dict[str, float], float | None, tuple[float, float]]:
    """``gradient_accumulation_steps`` micro-batches of ``rows``, then one clipped optimizer step.

    ``norm`` holds the loss denominators of the step; ``signal_norm`` those of the episodes
    actually forwarded (``rows``, over every process), which weigh the metrics. Also returns
    this process's (real, forwarded) token counts.
    """
    acc, variant = learner.accelerator, learner.config.algorithm.loss
    micro_rows = split_micro_batches(learner, batch, rows)
    sums: dict[str, float] = defaultdict(float)
    tokens = {"real": 0.0, "forwarded": 0.0}  # this process's, for update/pad_fraction

    def micro_loss(index: int) -> tuple[torch.Tensor, float]:
        # Every process runs the same number of forward/backward passes (collectives stay in step);
        # a process with nothing left runs the first 2 tokens of a row, with a loss that counts 0
        # (the optimizer still steps on the zero gradient, as it would on a batch without signal).
        dummy = len(micro_rows[index]) == 0
        picked = [0] if dummy else micro_rows[index].tolist()
        micro = batch.select(picked)
        micro = (micro.first_tokens(2) if dummy else micro).to(acc.device)
        adv = advantages[picked, : micro.input_ids.shape[1]].to(acc.device)
        old = None if old_logp is None else old_logp[picked, : micro.input_ids.shape[1] - 1].to(acc.device)
        loss, metrics, forward = micro_batch_loss(learner, micro, adv, old, norm, measure_sampler_kl)
        if dummy:
            # Where another process forwards episodes, this one still names every metric, with
            # weight 0: the mean over processes averages those that have a key.
            for key in metrics if signal_norm.sequences > 0 else ():
                sums[key] += 0.0
            return loss * 0.0, 1.0
        for key, value in metrics.items():
            sums[key] += value * metric_weight(key, micro, signal_norm, acc.num_processes, variant)
        tokens["real"] += forward.real_tokens
        tokens["forwarded"] += forward.forwarded_tokens
        return loss, 1.0  # the loss is already this micro-batch's share of the step's

    grad_norm = step_optimizer(learner, micro_loss)
    return dict(sums), grad_norm, (tokens["real"], tokens["forwarded"])


def split_micro_batches(learner: Learner, batch: RolloutBatch, rows: np.ndarray) -> list[np.ndarray]:
    """``rows`` in ``gradient_accumulation_steps`` micro-batches of similar lengths, or, with
    ``shared_prefix``, a group's rows together when their prompt forwarded once saves positions."""
    acc = learner.accelerator
    sharing = shares_prefix(learner.config, acc.device.type) and can_share_prefix(acc, learner.model)
    groups = [s.group for s in batch.stats] if sharing else None
    return micro_batch_rows(
        batch.input_ids, batch.attention_mask, rows, acc.gradient_accumulation_steps, groups
    )


def micro_batch_loss(
    learner: Learner,
    micro: RolloutBatch,
    advantages: torch.Tensor,
    old_logp: torch.Tensor | None,
    norm: Normaliser,
    measure_sampler_kl: bool = False,
) -> tuple[torch.Tensor, dict[str, float], TokenLogprobs]:
    """Forward pass and this micro-batch's share of its optimizer step's loss (``advantages`` ``[n, T]``),
    its metrics, and the forward (its positions run, for the padding share)."""
    algo = learner.config.algorithm
    mask = micro.loss_mask[:, 1:].float()
    # log pi_theta(x_t | x_<t) of every trained token, at temperature 1 (the sampler records raw logprobs)
    forward = rows_logprobs(learner, learner.model, micro, mask, entropy=True)
    logp = forward.logp
    sampler_logp = micro.old_logprobs[:, 1:]
    # guidance: demonstrations have no sampler, so the ratio, clip, TIS and KL terms see only the
    # policy's own tokens (own_mask); the demonstration's tokens get LUFFY's shaped term below
    demo = demonstration_rows(micro, mask.device)
    own_mask = mask if demo is None else mask * (~demo).unsqueeze(-1).to(mask.dtype)
    # pi_old: frozen before the first pass, or this very forward (detached: the ratio is then 1)
    old = logp.detach() if old_logp is None else old_logp
    # TIS: w_t = min(pi_theta / pi_sampler, cap), for samples drawn by another engine or older weights
    weights, tis_metrics = None, {}
    if algo.tis_cap:
        weights, tis_metrics = truncated_importance_weights(logp, sampler_logp, own_mask, algo.tis_cap)
    # KL penalty against the reference: log pi_ref of the same tokens (no gradient)
    ref_logp = reference_logprobs(learner, micro) if algo.beta > 0 else None
    # r_t = exp(logp - old); term_t = -w_t min(r_t A_t, clip(r_t, 1-eps_low, 1+eps_high) A_t) (GSPO:
    # one geometric-mean ratio per sequence); kl_t = beta * k(pi || pi_ref)
    spec = LossSpec(
        algo.loss,
        algo.clip_eps_low,
        algo.clip_eps_high,
        algo.beta,
        algo.kl_estimator,
        learner.config.rollout.max_total_tokens,
    )
    terms, kl, loss_metrics = loss_terms(
        spec, logp, old, advantages[:, 1:], own_mask, ref_logp=ref_logp, token_weights=weights
    )
    if demo is not None:  # LUFFY: term_t = -f(pi_t) A_t, f(p) = p / (p + gamma), no ratio, no clip
        shaped = policy_shaping_terms(logp, advantages[:, 1:], mask, algo.guidance.shaping_gamma)
        terms = torch.where(demo.unsqueeze(-1), shaped, terms)
    # this micro-batch's share: the variant's normaliser counts the whole step on every process
    loss = aggregate(algo.loss, terms, kl, mask, norm)
    out = {k: float(v) for k, v in (loss_metrics | tis_metrics).items()}
    out["loss"] = float(loss.detach())
    if measure_sampler_kl:  # with the HF policy the sampler is this module: the KL is ~1e-9
        out["sampler_kl"] = float(approx_kl(logp, sampler_logp, own_mask))
    out["entropy"] = forward.entropy
    if algo.ratio_is_one:
        for constant in _RATIO_ONE_METRICS:
            if constant != "loss" or algo.beta == 0:  # with a KL penalty the loss still moves
                out.pop(constant, None)
    return loss, out, forward


def demonstration_rows(micro: RolloutBatch, device: torch.device) -> torch.Tensor | None:
    """``[n]`` bool: which rows of ``micro`` are guidance demonstrations; None when none is (the
    update then runs exactly as without guidance)."""
    flags = [s.demonstration for s in micro.stats]
    return torch.tensor(flags, dtype=torch.bool, device=device) if any(flags) else None


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


# --------------------------------------------------------------------------------------------- forward passes
def rows_logprobs(
    learner: Learner, model: Any, micro: RolloutBatch, trained: torch.Tensor, *, entropy: bool = False
) -> TokenLogprobs:
    """:func:`~rlf_trainer.algorithms.optimize.token_logprobs` of ``micro``'s rows under ``model``,
    with the run's ``shared_prefix``; the entropy only where asked (the trained pass logs it)."""
    share = shares_prefix(learner.config, learner.accelerator.device.type)
    return token_logprobs(
        learner.accelerator, model, micro.input_ids, micro.attention_mask, trained, share_prefix=share,
        entropy=entropy,
    )  # fmt: skip


def reference_logprobs(learner: Learner, micro: RolloutBatch) -> torch.Tensor:
    """Trained tokens' log-probs under the reference: a frozen copy, or the LoRA base with adapters off."""
    trained = micro.loss_mask[:, 1:]
    with torch.no_grad():
        if learner.ref_model is not None:
            return rows_logprobs(learner, learner.ref_model, micro, trained).logp
        with learner.accelerator.unwrap_model(learner.model).disable_adapter():
            return rows_logprobs(learner, learner.model, micro, trained).logp


def sampler_kl_without_update(learner: Learner, batch: RolloutBatch, rows: list[int]) -> float:
    """``sampler_kl`` on up to a few of ``rows`` (no gradient), for a step that forwards no episode:
    the user still sees whether the engine holds the trained weights."""
    own = [row for row in rows if not batch.stats[row].demonstration]  # no sampler drew a demonstration
    picked = (
        own[:_SAMPLER_KL_ROWS]
        or [r for r in range(len(batch)) if not batch.stats[r].demonstration][:_SAMPLER_KL_ROWS]
    )
    if not picked:
        return 0.0
    micro = batch.select(picked).to(learner.accelerator.device)
    mask = micro.loss_mask[:, 1:]
    with torch.no_grad():
        logp = rows_logprobs(learner, learner.model, micro, mask).logp
    return float(approx_kl(logp, micro.old_logprobs[:, 1:], mask.float()))


__all__ = [
    "episode_advantages",
    "fill_batch",
    "micro_batch_loss",
    "staleness_metrics",
    "train_step",
    "trainable",
    "update",
]
