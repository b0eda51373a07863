"""Multi-turn episodes over a Gymnasium vector env with a :class:`~rlf_trainer.policy.Policy`.

``run_rollout`` resets ``num_envs`` envs (``G`` copies of each of ``B`` prompts), then per turn makes
ONE batched ``policy.generate`` call over every still-active episode and ONE ``envs.step`` with the
generated texts (finished envs get ``""``: with autoreset "Disabled" stepping them is a no-op).

Each episode's token sequence is built without ever re-tokenizing what the model wrote::

    prompt ids (chat template on info["messages"] + info["tools"])      loss 0, logprob 0
    turn 1: generated ids, exactly as sampled                          loss 1, sampler logprobs
            tool-result delta ids (chat.tool_delta_ids)                 loss 0, logprob 0
    turn 2: ...

Length budget: when the next turn would start at or beyond ``max_total_tokens`` (prompt + turns +
tool results), or a turn's generation runs past it (its ids are cut at the budget), the episode is
force-finished: the env is stepped with an empty assistant turn, which ends it as an answer-less
episode and scores it (0 for answer-matching rewards; a task's format or tool reward may still
give credit). Its finish reason is ``"max_total_tokens"``.

Example:
    >>> envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=8, autoreset_mode="Disabled")  # doctest: +SKIP
    >>> batch = run_rollout(envs, policy, prompt_indices=[3, 7], group_size=4,
    ...                     sampling=SamplingParams(max_new_tokens=256, seed=0),
    ...                     max_total_tokens=2048)                                         # doctest: +SKIP
    >>> batch.input_ids.shape[0], batch.rewards.shape                                      # doctest: +SKIP
    (8, torch.Size([8]))
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlf_trainer import chat
from rlf_trainer.policy.base import Completion, Policy, SamplingParams

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
class _Trajectory:
    """One episode being built."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    stats: EpisodeStats
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    done: bool = False
    force_finish: bool = False  # step the env with "" next turn: the budget is spent

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


# ---------------------------------------------------------------------------------------------------
# The rollout
# ---------------------------------------------------------------------------------------------------


def run_rollout(
    envs: Any,
    policy: Policy,
    prompt_indices: Sequence[int],
    *,
    group_size: int,
    sampling: SamplingParams,
    max_total_tokens: int,
    split: str = "train",
    max_turns: int | None = None,
) -> RolloutBatch:
    """Play one batch of episodes: ``prompt_indices[b]`` x ``group_size`` samples = ``envs.num_envs``.

    ``envs`` is any Gymnasium vector env following docs/env_contract.md, made with autoreset mode
    "Disabled". ``sampling.seed`` (when set) is offset by the turn number, so a batch is
    reproducible and turns do not reuse one random stream. ``max_turns`` is a safety stop for
    the loop (the env's own ``max_turns`` normally ends episodes first).
    """
    num_envs = int(envs.num_envs)
    if len(prompt_indices) * group_size != num_envs:
        raise RolloutError(
            f"{len(prompt_indices)} prompts x group_size {group_size} != num_envs {num_envs}; "
            "make the vector env with num_envs = prompts x group_size"
        )
    _check_autoreset_disabled(envs)
    tokenizer = policy.tokenizer
    end_id = turn_end_id(tokenizer)
    sampling = dataclasses.replace(
        sampling, stop_token_ids=tuple(dict.fromkeys([*sampling.stop_token_ids, end_id]))
    )
    timings = {"generate": 0.0, "tools+reward": 0.0, "tokenize": 0.0}
    started = time.perf_counter()

    task_indices = [int(p) for p in prompt_indices for _ in range(group_size)]
    t0 = time.perf_counter()
    _, infos = envs.reset(options={"task_indices": task_indices, "split": split})
    timings["tools+reward"] += time.perf_counter() - t0

    t0 = time.perf_counter()
    trajectories = [
        _start_trajectory(tokenizer, env_info(infos, i), group=i // group_size) for i in range(num_envs)
    ]
    timings["tokenize"] += time.perf_counter() - t0

    turn = 0
    while not all(traj.done for traj in trajectories):
        if max_turns is not None and turn >= max_turns:
            for traj in trajectories:
                traj.force_finish = traj.force_finish or not traj.done
        actions = [""] * num_envs
        completions: dict[int, Completion] = {}
        for traj in trajectories:
            if not traj.done and len(traj.token_ids) >= max_total_tokens:
                traj.force_finish = True  # e.g. a prompt longer than the whole budget
        generating = [i for i, traj in enumerate(trajectories) if not traj.done and not traj.force_finish]
        if generating:
            params = dataclasses.replace(
                sampling, seed=None if sampling.seed is None else sampling.seed + turn
            )
            t0 = time.perf_counter()
            outputs = policy.generate([trajectories[i].token_ids for i in generating], params)
            timings["generate"] += time.perf_counter() - t0
            if len(outputs) != len(generating):
                raise RolloutError(
                    f"policy returned {len(outputs)} completions for {len(generating)} prompts"
                )
            for i, completion in zip(generating, outputs, strict=True):
                traj = trajectories[i]
                room = max(0, max_total_tokens - len(traj.token_ids))
                ids, logprobs = completion.token_ids[:room], completion.logprobs[:room]
                traj.append(ids, trained=True, logprobs=logprobs)
                traj.stats.response_length += len(ids)
                traj.stats.turn_finish_reasons.append(completion.finish_reason)
                if len(completion.token_ids) > room:
                    traj.force_finish = True  # the turn was cut: the env never sees the partial text
                else:
                    actions[i] = completion.text
                    completions[i] = completion
        for i, traj in enumerate(trajectories):
            if traj.force_finish and not traj.done:
                actions[i] = ""

        t0 = time.perf_counter()
        _, rewards, terminated, truncated, infos = envs.step(actions)
        timings["tools+reward"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        for i, traj in enumerate(trajectories):
            if traj.done:
                continue
            info = env_info(infos, i)
            if info.get("inactive"):
                raise RolloutError(
                    f"env {i} was finished before the rollout ended it: autoreset must be Disabled"
                )
            traj.stats.turns += 1
            _record_tool_use(traj.stats, info)
            if "messages" in info:
                traj.messages = list(info["messages"])
            if bool(terminated[i]) or bool(truncated[i]):
                _finish(traj, float(rewards[i]), info, terminated=bool(terminated[i]))
                continue
            if traj.force_finish:
                raise RolloutError(f"env {i} did not end the episode on an empty assistant turn")
            _append_tool_delta(tokenizer, traj, info, completions.get(i), end_id, max_total_tokens)
        timings["tokenize"] += time.perf_counter() - t0
        turn += 1

    timings["total"] = time.perf_counter() - started
    return _to_batch(trajectories, tokenizer, end_id, timings)


def _check_autoreset_disabled(envs: Any) -> None:
    mode = (getattr(envs, "metadata", None) or {}).get("autoreset_mode")
    value = getattr(mode, "value", mode)
    if value is not None and str(value) != "Disabled":
        raise RolloutError(
            f"the vector env resets finished episodes (autoreset_mode={value}); "
            "make it with autoreset_mode='Disabled'"
        )


def _start_trajectory(tokenizer: Any, info: dict[str, Any], *, group: int) -> _Trajectory:
    messages = list(info.get("messages") or [])
    tools = list(info.get("tools") or [])
    if not messages:
        raise RolloutError("reset info has no 'messages': the env does not follow the env contract")
    ids = chat.prompt_ids(tokenizer, messages, tools)
    stats = EpisodeStats(task_id=info.get("task_id"), group=group, prompt_length=len(ids))
    traj = _Trajectory(token_ids=[], loss_mask=[], logprobs=[], stats=stats, messages=messages, tools=tools)
    traj.append(ids, trained=False)
    return traj


def _record_tool_use(stats: EpisodeStats, info: dict[str, Any]) -> None:
    calls = list(info.get("tool_calls") or [])
    stats.tool_calls += len(calls)
    errors = [str(e) for e in (info.get("errors") or [])]
    stats.tool_errors += len(errors)
    stats.error_kinds.extend(errors)


def _finish(traj: _Trajectory, reward: float, info: dict[str, Any], *, terminated: bool) -> None:
    traj.done = True
    stats = traj.stats
    stats.reward = reward
    stats.reward_info = dict(info.get("reward_info") or {})
    if traj.force_finish:
        stats.finish_reason = FINISH_MAX_TOKENS
    else:
        stats.finish_reason = FINISH_ANSWER if terminated else FINISH_MAX_TURNS
    if "answer" in info:
        stats.answered = info["answer"] is not None
    stats.correct = _correct_from(stats.reward_info)


def _append_tool_delta(
    tokenizer: Any,
    traj: _Trajectory,
    info: dict[str, Any],
    completion: Completion | None,
    end_id: int,
    max_total_tokens: int,
) -> None:
    """After a tool turn: close the turn if the model did not, then append the tool-result delta."""
    tool_messages = list(info.get("tool_messages") or [])
    messages = traj.messages
    if not tool_messages or messages[-len(tool_messages) :] != tool_messages:
        raise RolloutError("a tool turn's info needs 'tool_messages' at the end of 'messages'")
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


def _to_batch(
    trajectories: list[_Trajectory], tokenizer: Any, end_id: int, timings: dict[str, float]
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
    )
