"""The pieces both rollouts build episodes from: trajectories and their stats.

A :class:`Trajectory` is one episode's token sequence under construction; :func:`add_completion`
appends a generated turn exactly as sampled (loss 1, sampler logprobs), :func:`apply_step` folds an
env step into it (finish and score, or append the tool-result delta, or the simulated user's
message on a dialogue turn, with loss 0), and
:func:`rlf_trainer.rollout.batch.to_batch` pads the finished episodes into a
:class:`~rlf_trainer.rollout.batch.RolloutBatch`. The lockstep rollout
(:mod:`rlf_trainer.rollout.lockstep`) and the async one (:mod:`rlf_trainer.rollout.async_rollout`) differ only in
when they call these. :func:`record_step` is the part of :func:`apply_step` without tokens: the
text rollout (:mod:`rlf_trainer.rollout.text_rollout`, an agent behind an endpoint) scores its
episodes with it, so both count turns, tool calls, errors and finish reasons the same way.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlf_envs.info_keys import (
    ANSWER,
    ERRORS,
    FINISH_ANSWER,
    FINISH_MAX_TOKENS,
    FINISH_MAX_TURNS,
    FINISH_SIM_ERROR,
    INACTIVE,
    MESSAGES,
    REWARD_INFO,
    SIM_ERROR,
    TASK_ID,
    TASK_METADATA,
    TOOL_CALLS,
    TOOL_MESSAGES,
    TOOLS,
    USER_MESSAGE,
)
from rlf_trainer.policy.base import Completion, SamplingParams
from rlf_trainer.rollout import chat


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
    tool_call_keys: list[str] = field(default_factory=list)  # name + arguments of each call, to spot repeats
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
    task_metadata: dict[str, Any] = field(default_factory=dict)  # reset info: e.g. DeepSearch's hops
    demonstration: bool = False  # played by algorithm.guidance's demonstrator, not sampled by the policy
    # the oldest weights version that sampled one of its turns, where the policy reports versions
    # (the remote policy); None: sampled with the current weights
    weights_version: int | None = None


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
    messages = list(info.get(MESSAGES) or [])
    tools = list(info.get(TOOLS) or [])
    if not messages:
        raise RolloutError("reset info has no 'messages': the env does not follow the env contract")
    ids = chat.prompt_ids(tokenizer, messages, tools)
    stats = EpisodeStats(task_id=info.get(TASK_ID), group=group, prompt_length=len(ids),
                         task_metadata=dict(info.get(TASK_METADATA) or {}))  # fmt: skip
    traj = Trajectory(token_ids=[], loss_mask=[], logprobs=[], stats=stats, messages=messages, tools=tools)
    traj.append(ids, trained=False)
    return traj


@dataclass
class RolloutStart:
    """What both rollouts begin with: a trajectory per env, the end-of-turn id, the sampling to use."""

    trajectories: list[Trajectory]
    end_id: int
    sampling: SamplingParams  # the caller's, with the end-of-turn id among its stop tokens
    reset_s: float
    tokenize_s: float


def start_rollout(
    envs: Any,
    tokenizer: Any,
    prompt_indices: Sequence[int],
    group_size: int,
    sampling: SamplingParams,
    split: str,
) -> RolloutStart:
    """Check the vector env, reset it on ``prompt_indices`` x ``group_size``, one trajectory per env."""
    num_envs = int(envs.num_envs)
    if len(prompt_indices) * group_size != num_envs:
        raise RolloutError(
            f"{len(prompt_indices)} prompts x group_size {group_size} != num_envs {num_envs}; "
            "make the vector env with num_envs = prompts x group_size"
        )
    check_autoreset_disabled(envs)
    end_id = turn_end_id(tokenizer)
    sampling = dataclasses.replace(
        sampling, stop_token_ids=tuple(dict.fromkeys([*sampling.stop_token_ids, end_id]))
    )
    task_indices = [int(p) for p in prompt_indices for _ in range(group_size)]
    t0 = time.perf_counter()
    _, infos = envs.reset(options={"task_indices": task_indices, "split": split})
    t1 = time.perf_counter()
    trajectories = [
        start_trajectory(tokenizer, env_info(infos, i), group=i // group_size) for i in range(num_envs)
    ]
    return RolloutStart(trajectories, end_id, sampling, t1 - t0, time.perf_counter() - t1)


def record_tool_use(stats: EpisodeStats, info: dict[str, Any]) -> None:
    calls = list(info.get(TOOL_CALLS) or [])
    stats.tool_calls += len(calls)
    stats.tool_call_keys.extend(
        json.dumps([c.get("name"), c.get("arguments")], sort_keys=True, default=str) for c in calls
    )
    errors = [str(e) for e in (info.get(ERRORS) or [])]
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
    stats.reward_info = dict(info.get(REWARD_INFO) or {})
    if traj.force_finish:
        stats.finish_reason = FINISH_MAX_TOKENS
    elif info.get(SIM_ERROR):
        stats.finish_reason = FINISH_SIM_ERROR
    else:
        stats.finish_reason = FINISH_ANSWER if terminated else FINISH_MAX_TURNS
    if ANSWER in info:
        stats.answered = info[ANSWER] is not None
    stats.correct = _correct_from(stats.reward_info)


def step_messages(info: dict[str, Any]) -> list[dict[str, Any]]:
    """The messages an ongoing step added after the assistant turn: tool results, or the user's reply.

    Example:
        >>> step_messages({"tool_messages": [], "user_message": {"role": "user", "content": "hi"}})
        [{'role': 'user', 'content': 'hi'}]
    """
    tool_messages = list(info.get(TOOL_MESSAGES) or [])
    if tool_messages:
        return tool_messages
    user_message = info.get(USER_MESSAGE)
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
    if completion.weights_version is not None:  # the episode is as stale as its oldest turn
        tags = [v for v in (traj.stats.weights_version, completion.weights_version) if v is not None]
        traj.stats.weights_version = min(tags)
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


def record_step(traj: Trajectory, index: int, step: tuple[float, bool, bool, dict[str, Any]]) -> bool:
    """Count env ``index``'s ``(reward, terminated, truncated, info)`` in the trajectory's stats and
    messages, and finish it when the episode ended (returns whether it did). No tokens: what the
    token rollouts and the text rollout (:mod:`rlf_trainer.rollout.text_rollout`) share."""
    reward, terminated, truncated, info = step
    if info.get(INACTIVE):
        raise RolloutError(
            f"env {index} was finished before the rollout ended it: autoreset must be Disabled"
        )
    traj.stats.turns += 1
    traj.step_rewards.append(float(reward))
    record_tool_use(traj.stats, info)
    if info.get(USER_MESSAGE):
        traj.stats.user_turns += 1
    if info.get(SIM_ERROR):
        traj.stats.sim_error = str(info[SIM_ERROR])
    if MESSAGES in info:
        traj.messages = list(info[MESSAGES])
    if terminated or truncated:
        finish_trajectory(traj, float(reward), info, terminated=bool(terminated))
        return True
    return False


def apply_step(
    traj: Trajectory,
    index: int,
    step: tuple[float, bool, bool, dict[str, Any]],
    completion: Completion | None,
    context: TurnContext,
) -> None:
    """Fold env ``index``'s ``(reward, terminated, truncated, info)`` into its trajectory."""
    if record_step(traj, index, step):
        return
    if traj.force_finish:
        raise RolloutError(f"env {index} did not end the episode on an empty assistant turn")
    info = step[3]
    append_tool_delta(context.tokenizer, traj, info, completion, context.end_id, context.max_total_tokens)
