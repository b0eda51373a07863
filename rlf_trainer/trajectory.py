"""The pieces both rollouts build episodes from: trajectories, their stats, and the padded batch.

A :class:`Trajectory` is one episode's token sequence under construction; :func:`add_completion`
appends a generated turn exactly as sampled (loss 1, sampler logprobs), :func:`apply_step` folds an
env step into it (finish and score, or append the tool-result delta, or the simulated user's
message on a dialogue turn, with loss 0), and
:func:`to_batch` pads the finished episodes into a :class:`RolloutBatch`. The lockstep rollout
(:mod:`rlf_trainer.rollout`) and the async one (:mod:`rlf_trainer.rollout_async`) differ only in
when they call these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlf_trainer import chat
from rlf_trainer.policy.base import Completion

FINISH_ANSWER = "answer"  # the env terminated the episode (an answer, or a turn without tool call)
FINISH_MAX_TURNS = "max_turns"  # the env truncated it (max_turns or its own budget)
FINISH_MAX_TOKENS = "max_total_tokens"  # our token budget ran out; force-finished with an empty turn


class RolloutError(RuntimeError):
    """The env or the policy broke the contract the rollout relies on."""


@dataclass
class EpisodeStats:
    """What one episode did; ``answered``/``correct`` are None when the env does not report them."""

    task_id: str | None
    group: int
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    error_kinds: list[str] = field(default_factory=list)
    answered: bool | None = None
    correct: bool | None = None
    prompt_length: int = 0
    response_length: int = 0  # generated tokens (loss-mask 1), every turn together
    total_length: int = 0
    finish_reason: str = ""
    turn_finish_reasons: list[str] = field(default_factory=list)  # the policy's "stop"/"length" per turn
    reward: float = 0.0
    reward_info: dict[str, Any] = field(default_factory=dict)
    user_turns: int = 0  # dialogue envs: messages of the simulated user after the prompt
    sim_error: str | None = None  # the env's info["sim_error"]: the user simulator failed (a kind)


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
    group_ids: torch.Tensor
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
            group_ids=self.group_ids[index],
            stats=[self.stats[i] for i in picked],
            transcripts=[self.transcripts[i] for i in picked],
            tools=[self.tools[i] for i in picked] if self.tools else [],
            timelines=[self.timelines[i] for i in picked] if self.timelines else [],
            turn_spans=[self.turn_spans[i] for i in picked] if self.turn_spans else [],
            turn_rewards=[self.turn_rewards[i] for i in picked] if self.turn_rewards else [],
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
            group_ids=torch.cat([b.group_ids for b in batches]),
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
            group_ids=self.group_ids.to(device),
        )


@dataclass
class Trajectory:
    """One episode being built."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    stats: EpisodeStats
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    done: bool = False
    force_finish: bool = False  # step the env with "" next turn: the budget is spent
    turn_spans: list[tuple[int, int]] = field(default_factory=list)  # each generated turn's tokens
    step_rewards: list[float] = field(default_factory=list)  # the env's reward of each step

    def append(self, ids: Sequence[int], *, trained: bool, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(int(t) for t in ids)
        self.loss_mask.extend([1 if trained else 0] * len(ids))
        self.logprobs.extend([float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids))


# ---------------------------------------------------------------------------------------------------
# Gymnasium vector infos -> one env's info
# ---------------------------------------------------------------------------------------------------


def env_info(infos: dict[str, Any], i: int) -> dict[str, Any]:
    """Env ``i``'s info dict out of Gymnasium's batched infos (``infos[k][i]`` where ``infos["_k"][i]``).

    Example:
        >>> import numpy as np
        >>> env_info({"a": np.array([1, 2]), "_a": np.array([False, True])}, 1)
        {'a': 2}
    """
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not bool(mask[i]):
            continue
        if isinstance(value, dict):
            out[key] = env_info(value, i)
        else:
            item = value[i]
            out[key] = item.item() if isinstance(item, np.generic) else item
    return out


def turn_end_id(tokenizer: Any) -> int:
    """The token that closes an assistant turn: ``<|im_end|>`` for ChatML templates, else eos."""
    token = chat.default_end_of_turn(tokenizer)
    if token is None:
        raise RolloutError("the tokenizer has neither <|im_end|> nor an eos token to end a turn")
    return int(tokenizer.convert_tokens_to_ids(token))


def _correct_from(reward_info: dict[str, Any]) -> bool | None:
    for key in ("acc", "em"):
        if key in reward_info and reward_info[key] is not None:
            try:
                return float(reward_info[key]) >= 0.5
            except (TypeError, ValueError):
                return None
    return None


def check_autoreset_disabled(envs: Any) -> None:
    mode = (getattr(envs, "metadata", None) or {}).get("autoreset_mode")
    value = getattr(mode, "value", mode)
    if value is not None and str(value) != "Disabled":
        raise RolloutError(
            f"the vector env resets finished episodes (autoreset_mode={value}); "
            "make it with autoreset_mode='Disabled'"
        )


def start_trajectory(tokenizer: Any, info: dict[str, Any], *, group: int) -> Trajectory:
    messages = list(info.get("messages") or [])
    tools = list(info.get("tools") or [])
    if not messages:
        raise RolloutError("reset info has no 'messages': the env does not follow the env contract")
    ids = chat.prompt_ids(tokenizer, messages, tools)
    stats = EpisodeStats(task_id=info.get("task_id"), group=group, prompt_length=len(ids))
    traj = Trajectory(token_ids=[], loss_mask=[], logprobs=[], stats=stats, messages=messages, tools=tools)
    traj.append(ids, trained=False)
    return traj


def record_tool_use(stats: EpisodeStats, info: dict[str, Any]) -> None:
    calls = list(info.get("tool_calls") or [])
    stats.tool_calls += len(calls)
    errors = [str(e) for e in (info.get("errors") or [])]
    stats.tool_errors += len(errors)
    stats.error_kinds.extend(errors)


def turn_rewards_of(traj: Trajectory) -> list[float]:
    """The env's step rewards, one per generated turn.

    A step without a turn of its own (the empty turn that ends an episode whose token budget ran
    out) credits the last generated turn: its tokens are what the reward judges.

    Example:
        >>> traj = Trajectory([], [], [], EpisodeStats(None, 0), [], [], turn_spans=[(3, 5), (7, 9)],
        ...                   step_rewards=[0.1, 0.0, 1.0])
        >>> turn_rewards_of(traj)
        [0.1, 1.0]
    """
    spans = len(traj.turn_spans)
    if spans == 0:
        return []
    rewards = list(traj.step_rewards[:spans]) + [0.0] * max(0, spans - len(traj.step_rewards))
    rewards[-1] += sum(traj.step_rewards[spans:])
    return rewards


def finish_trajectory(traj: Trajectory, reward: float, info: dict[str, Any], *, terminated: bool) -> None:
    """End the episode: its reward is the return, the sum of every step's reward (Gymnasium's)."""
    traj.done = True
    stats = traj.stats
    stats.reward = float(sum(traj.step_rewards)) if traj.step_rewards else reward
    stats.reward_info = dict(info.get("reward_info") or {})
    if traj.force_finish:
        stats.finish_reason = FINISH_MAX_TOKENS
    else:
        stats.finish_reason = FINISH_ANSWER if terminated else FINISH_MAX_TURNS
    if "answer" in info:
        stats.answered = info["answer"] is not None
    stats.correct = _correct_from(stats.reward_info)


def step_messages(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages an ongoing step added after the assistant turn: tool results, or the user's reply.

    Example:
        >>> step_messages({"tool_messages": [], "user_message": {"role": "user", "content": "hi"}})
        [{'role': 'user', 'content': 'hi'}]
    """
    tool_messages = list(info.get("tool_messages") or [])
    if tool_messages:
        return tool_messages
    user_message = info.get("user_message")
    return [dict(user_message)] if user_message else []


def append_tool_delta(
    tokenizer: Any,
    traj: Trajectory,
    info: dict[str, Any],
    completion: Completion | None,
    end_id: int,
    max_total_tokens: int,
) -> None:
    """After a tool (or user) turn: close the turn if the model did not, then append the template's delta.

    The delta of a dialogue turn is the simulated user's message (``info["user_message"]``) and
    the next assistant header, loss 0 like tool results.
    """
    tool_messages = step_messages(info)
    messages = traj.messages
    if not tool_messages or messages[-len(tool_messages) :] != tool_messages:
        raise RolloutError(
            "an ongoing turn's info needs 'tool_messages' (or a 'user_message') at the end of 'messages'"
        )
    before = messages[: -len(tool_messages)]
    # A turn cut at max_new_tokens never produced the end-of-turn token: the delta then starts with it.
    unclosed = completion is None or not completion.token_ids or completion.token_ids[-1] != end_id
    delta = chat.tool_delta_ids(
        tokenizer,
        before,
        tool_messages,
        traj.tools,
        end_of_turn=tokenizer.convert_ids_to_tokens(end_id),
        include_end_of_turn=unclosed,
    )
    if len(traj.token_ids) + len(delta) >= max_total_tokens:
        traj.force_finish = True
        return
    traj.append(delta, trained=False)


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
        group_ids=torch.tensor([t.stats.group for t in trajectories], dtype=torch.long),
        stats=[t.stats for t in trajectories],
        transcripts=[t.messages for t in trajectories],
        timings=dict(timings),
        tools=[t.tools for t in trajectories],
        turn_spans=[list(t.turn_spans) for t in trajectories],
        turn_rewards=[turn_rewards_of(t) for t in trajectories],
    )


def add_completion(traj: Trajectory, completion: Completion, max_total_tokens: int) -> bool:
    """Append a generated turn (cut at the budget); False when it was cut, so the env must not see it."""
    room = max(0, max_total_tokens - len(traj.token_ids))
    ids, logprobs = completion.token_ids[:room], completion.logprobs[:room]
    start = len(traj.token_ids)
    traj.append(ids, trained=True, logprobs=logprobs)
    if ids:
        traj.turn_spans.append((start, len(traj.token_ids)))
    traj.stats.response_length += len(ids)
    traj.stats.turn_finish_reasons.append(completion.finish_reason)
    if len(completion.token_ids) > room:
        traj.force_finish = True  # the turn was cut: the env never sees the partial text
        return False
    return True


@dataclass(frozen=True)
class TurnContext:
    """What :func:`apply_step` needs besides the step result: the tokenizer and the budget."""

    tokenizer: Any
    end_id: int
    max_total_tokens: int


def apply_step(
    traj: Trajectory,
    index: int,
    step: tuple[float, bool, bool, dict[str, Any]],
    completion: Completion | None,
    context: TurnContext,
) -> None:
    """Fold env ``index``'s ``(reward, terminated, truncated, info)`` into its trajectory."""
    reward, terminated, truncated, info = step
    if info.get("inactive"):
        raise RolloutError(
            f"env {index} was finished before the rollout ended it: autoreset must be Disabled"
        )
    traj.stats.turns += 1
    traj.step_rewards.append(float(reward))
    record_tool_use(traj.stats, info)
    if info.get("user_message"):
        traj.stats.user_turns += 1
    if info.get("sim_error"):
        traj.stats.sim_error = str(info["sim_error"])
    if "messages" in info:
        traj.messages = list(info["messages"])
    if terminated or truncated:
        finish_trajectory(traj, float(reward), info, terminated=bool(terminated))
        return
    if traj.force_finish:
        raise RolloutError(f"env {index} did not end the episode on an empty assistant turn")
    append_tool_delta(context.tokenizer, traj, info, completion, context.end_id, context.max_total_tokens)
