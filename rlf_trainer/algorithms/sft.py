"""One SFT step, top to bottom: demonstrations -> masked next-token loss -> one optimizer step.

``algorithm.name: sft`` runs this step in the same trainer loop as GRPO (:mod:`rlf_trainer.trainer`):
the same Accelerate setup, micro-batches, TensorBoard and metrics JSONL, checkpoints with exact
resume, evaluation through the env, and the exported model. The data is ``sft.data``, chat-messages
JSONL such as ``rlf-collect`` writes; :mod:`rlf_trainer.algorithms.sft_data` turns each line into the token
ids and loss mask the RL rollout would build for the same episode (only the assistant's tokens
carry loss; system, user and tool tokens are masked).

Step ``k`` trains on ``sft.batch_size`` examples (across all processes, each process its shard),
drawn epoch-wise shuffled by the same :class:`~rlf_trainer.prompts.PromptSampler` that picks
GRPO's prompts, so a resumed run sees exactly the examples the original run would have. The loss
is the mean negative log-likelihood over every assistant token of the step's batch (one
normaliser, summed over micro-batches and processes)::

    loss = - sum_{i, t} m_it * log pi(x_it | x_i<t) / sum_{i, t} m_it
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from rlf_trainer.algorithms.optimize import (
    Learner,
    shares_prefix,
    step_optimizer,
    sync_weights,
    token_logprobs,
)
from rlf_trainer.algorithms.sft_data import SFTData, SFTExample
from rlf_trainer.algorithms.shared_prefix import micro_batch_rows
from rlf_trainer.prompts import PromptSampler


def padded(examples: list[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``loss_mask`` of ``examples``."""
    width = max(len(e.token_ids) for e in examples)
    out = {
        "input_ids": torch.full((len(examples), width), int(pad_id), dtype=torch.long),
        "attention_mask": torch.zeros((len(examples), width), dtype=torch.long),
        "loss_mask": torch.zeros((len(examples), width), dtype=torch.long),
    }
    for row, example in enumerate(examples):
        n = len(example.token_ids)
        out["input_ids"][row, :n] = torch.tensor(example.token_ids)
        out["attention_mask"][row, :n] = 1
        out["loss_mask"][row, :n] = torch.tensor(example.loss_mask)
    return out


def step_examples(data: SFTData, sampler: PromptSampler, step: int, batch_size: int, rank: int,
                  world_size: int) -> list[SFTExample]:  # fmt: skip
    """This process's share of step ``step``'s examples (the ranks' shares are disjoint)."""
    everyone = sampler.indices(step, batch_size)
    per_rank = batch_size // world_size
    return [data.examples[i] for i in everyone[rank * per_rank : (rank + 1) * per_rank]]


def sft_step(
    learner: Learner, policy: Any, data: SFTData, sampler: PromptSampler, step: int
) -> dict[str, float]:
    """SFT step ``step`` (0-based): one optimizer step on this process's share of the step's examples."""
    started = time.perf_counter()
    cfg, acc = learner.config, learner.accelerator
    examples = step_examples(data, sampler, step, cfg.sft.batch_size, acc.process_index, acc.num_processes)
    pad_id = policy.tokenizer.pad_token_id
    batch = padded(examples, int(pad_id if pad_id is not None else 0))
    # 1. the normaliser: every assistant token of the step, on every process
    local_tokens = float(batch["loss_mask"][:, 1:].sum())
    total_tokens = float(acc.reduce(torch.tensor(local_tokens, device=acc.device), reduction="sum"))
    # micro-batches of similar lengths, each trimmed to its longest example: little padding
    lengths = batch["attention_mask"].sum(dim=1)
    micro_rows = micro_batch_rows(
        batch["input_ids"], batch["attention_mask"], np.arange(len(lengths)), acc.gradient_accumulation_steps
    )
    nll_sum, forwarded, real = 0.0, 0, 0
    learner.model.train()

    # 2. micro-batches: every process runs the same number of passes (collectives stay in step)
    def micro_loss(index: int) -> tuple[torch.Tensor, float]:
        nonlocal nll_sum, forwarded, real
        rows = micro_rows[index]
        picked = rows.tolist() or [0]
        weight = 0.0 if not len(rows) else 1.0
        width = int(lengths[picked].max())
        micro = {k: v[picked, :width].to(acc.device) for k, v in batch.items()}
        trained = micro["loss_mask"][:, 1:]
        forward = token_logprobs(
            acc,
            learner.model,
            micro["input_ids"],
            micro["attention_mask"],
            trained,
            share_prefix=shares_prefix(cfg, acc.device.type),
            entropy=False,
        )
        if len(rows):
            forwarded, real = forwarded + forward.forwarded_tokens, real + forward.real_tokens
        nll = -(forward.logp * trained.float()).sum() * weight
        nll_sum += float(nll.detach())
        return nll, max(total_tokens, 1.0)  # the token mean over the whole step's batch

    grad_norm = step_optimizer(learner, micro_loss)
    global_nll = float(acc.reduce(torch.tensor(nll_sum, device=acc.device), reduction="sum"))
    metrics = {
        "sft/loss": global_nll / max(total_tokens, 1.0),
        "sft/tokens": total_tokens,
        "sft/examples": float(cfg.sft.batch_size),
        "sft/too_long": float(len(data.too_long)),
        "sft/epoch": step * cfg.sft.batch_size / len(data.examples),
        "lr": learner.scheduler.get_last_lr()[0],
    }
    if forwarded:
        metrics["update/pad_fraction"] = 1.0 - real / forwarded
        metrics["update/tokens"] = float(real)
    learner.scheduler.step()
    if grad_norm is not None:
        metrics["grad_norm"] = grad_norm
    sync_weights(learner, policy)
    metrics["time/step"] = time.perf_counter() - started
    return metrics


__all__ = ["padded", "sft_step", "step_examples"]
