"""RolloutBatch: finished episodes as right-padded tensors, what the GRPO step trains on.

:func:`to_batch` builds one from the trajectories of a rollout (:mod:`rlf_trainer.rollout.trajectory`);
:meth:`RolloutBatch.select` and :meth:`RolloutBatch.concat` make the micro-batches and the
dynamic-sampling refills.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlf_trainer.rollout.trajectory import EpisodeStats, Trajectory, turn_rewards_of


@dataclass
class RolloutBatch:
    """``N`` episodes as right-padded tensors plus per-episode records.

    Per-token tensors are ``[N, T]`` and aligned with ``input_ids``: ``old_logprobs[i, t]`` is the
    sampler's log-probability of ``input_ids[i, t]`` (0 where ``loss_mask`` is 0).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    rewards: torch.Tensor
    stats: list[EpisodeStats]
    transcripts: list[list[dict[str, Any]]]
    timings: dict[str, float]
    tools: list[list[dict[str, Any]]] = field(default_factory=list)
    timelines: list[Any] = field(default_factory=list)  # async rollout: per-episode generate/step seconds
    # Per episode, per generated turn: its token columns [start, end) and the env's reward for it
    # (the rewards of an episode sum to its return, ``rewards[i]``).
    turn_spans: list[list[tuple[int, int]]] = field(default_factory=list)
    turn_rewards: list[list[float]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, indices: Sequence[int] | torch.Tensor) -> RolloutBatch:
        """The episodes at ``indices``, columns trimmed to the longest kept sequence."""
        index = torch.as_tensor(
            list(indices) if not isinstance(indices, torch.Tensor) else indices, dtype=torch.long
        )
        lengths = self.attention_mask[index].sum(dim=1)
        width = int(lengths.max().item()) if len(index) else 0
        picked = [int(i) for i in index.tolist()]
        return dataclasses.replace(
            self,
            input_ids=self.input_ids[index, :width],
            attention_mask=self.attention_mask[index, :width],
            loss_mask=self.loss_mask[index, :width],
            old_logprobs=self.old_logprobs[index, :width],
            rewards=self.rewards[index],
            stats=[self.stats[i] for i in picked],
            transcripts=[self.transcripts[i] for i in picked],
            tools=[self.tools[i] for i in picked] if self.tools else [],
            timelines=[self.timelines[i] for i in picked] if self.timelines else [],
            turn_spans=[self.turn_spans[i] for i in picked] if self.turn_spans else [],
            turn_rewards=[self.turn_rewards[i] for i in picked] if self.turn_rewards else [],
        )

    def first_tokens(self, width: int) -> RolloutBatch:
        """Every episode cut to its first ``width`` columns (a stand-in for a pass that must run
        but trains nothing); per-episode fields are kept as they are."""
        cut = min(width, int(self.input_ids.shape[1]))
        return dataclasses.replace(
            self,
            input_ids=self.input_ids[:, :cut],
            attention_mask=self.attention_mask[:, :cut],
            loss_mask=self.loss_mask[:, :cut],
            old_logprobs=self.old_logprobs[:, :cut],
        )

    @staticmethod
    def concat(batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
        """One batch of every episode of ``batches`` (right-padded with ``pad_id``; timings summed)."""
        if len(batches) == 1:
            return batches[0]
        width = max(int(b.input_ids.shape[1]) for b in batches)

        def cat(name: str, fill: int | float) -> torch.Tensor:
            parts = [getattr(b, name) for b in batches]
            padded = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts]
            return torch.cat(padded)

        timings: dict[str, float] = {}
        for b in batches:
            for key, value in b.timings.items():
                timings[key] = timings.get(key, 0.0) + value
        return RolloutBatch(
            input_ids=cat("input_ids", pad_id),
            attention_mask=cat("attention_mask", 0),
            loss_mask=cat("loss_mask", 0),
            old_logprobs=cat("old_logprobs", 0.0),
            rewards=torch.cat([b.rewards for b in batches]),
            stats=[s for b in batches for s in b.stats],
            transcripts=[t for b in batches for t in b.transcripts],
            timings=timings,
            tools=[t for b in batches for t in b.tools],
            timelines=[t for b in batches for t in b.timelines],
            turn_spans=[t for b in batches for t in b.turn_spans],
            turn_rewards=[t for b in batches for t in b.turn_rewards],
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        return dataclasses.replace(
            self,
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            loss_mask=self.loss_mask.to(device),
            old_logprobs=self.old_logprobs.to(device),
            rewards=self.rewards.to(device),
        )


def to_batch(
    trajectories: list[Trajectory], tokenizer: Any, end_id: int, timings: dict[str, float]
) -> RolloutBatch:
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    n = len(trajectories)
    width = max(len(t.token_ids) for t in trajectories)
    input_ids = torch.full((n, width), int(pad_id), dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width), dtype=torch.long)
    old_logprobs = torch.zeros((n, width), dtype=torch.float32)
    for row, traj in enumerate(trajectories):
        length = len(traj.token_ids)
        traj.stats.total_length = length
        input_ids[row, :length] = torch.tensor(traj.token_ids, dtype=torch.long)
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = torch.tensor(traj.loss_mask, dtype=torch.long)
        old_logprobs[row, :length] = torch.tensor(traj.logprobs, dtype=torch.float32)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        old_logprobs=old_logprobs,
        rewards=torch.tensor([t.stats.reward for t in trajectories], dtype=torch.float32),
        stats=[t.stats for t in trajectories],
        transcripts=[t.messages for t in trajectories],
        timings=dict(timings),
        tools=[t.tools for t in trajectories],
        turn_spans=[list(t.turn_spans) for t in trajectories],
        turn_rewards=[turn_rewards_of(t) for t in trajectories],
    )
