"""Demonstrations played through the rollout's own envs and trajectory code (``algorithm.guidance``).

A :class:`Demonstrator` is any agent ``agent(messages, tools, info) -> str`` (sync or async): the
next assistant turn as text, tool calls in the ``<tool_call>`` form the env parses. rlf-collect's
agents are demonstrators (:mod:`rlf_trainer.data.demonstrations`: the DeepSearch oracle, any
scripted ``module:callable``, an OpenAI-compatible endpoint); the trainer builds one from the
config and hands it to the step in :class:`~rlf_trainer.rollout.collect.RolloutState`, so the
GRPO step (:mod:`rlf_trainer.algorithms.grpo`) never imports ``data/``.

:func:`play_demonstrations` plays each request on one env slot of the step's vector env (the slot
of the sample the demonstration replaces) and builds its episode with the very functions the
rollouts use (:func:`~rlf_trainer.rollout.trajectory.start_trajectory`,
:func:`~rlf_trainer.rollout.trajectory.add_completion`,
:func:`~rlf_trainer.rollout.trajectory.apply_step`): each turn's tokens are the canonical encoding
of the demonstrator's text plus the end-of-turn token, exactly what a policy that wrote that text
would have sampled, and the tool deltas, budget and finish reasons are the rollout's. Its sampler
log-probs are 0 (there is no sampler): the trainer computes the policy's own.
:func:`replace_episodes` puts the demonstrations into the batch in place of the replaced samples.

Example:
    >>> def say_hi(messages, tools, info):
    ...     return "<answer>hi</answer>"
    >>> isinstance(say_hi, Demonstrator)
    True
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from rlf_trainer.policy.base import Completion
from rlf_trainer.rollout import chat
from rlf_trainer.rollout.batch import RolloutBatch, to_batch
from rlf_trainer.rollout.trajectory import (
    RolloutError,
    Trajectory,
    TurnContext,
    add_completion,
    apply_step,
    start_trajectory,
    turn_end_id,
)

Message = dict[str, Any]


@runtime_checkable
class Demonstrator(Protocol):
    """An agent that plays an episode turn by turn: the chat so far, the env's tools and the reset
    info (``task_id``, ...) in; the next assistant turn's text out (or an awaitable of it)."""

    def __call__(
        self, messages: list[Message], tools: list[dict[str, Any]], info: dict[str, Any]
    ) -> str | Awaitable[str]: ...


@dataclass(frozen=True)
class DemonstrationRequest:
    """One demonstration to play: on env ``slot`` (the replaced sample's), task ``task_index`` of the
    env's current split, for group ``group`` of the batch."""

    slot: int
    task_index: int
    group: int


def demonstration_completion(tokenizer: Any, text: str, end_id: int) -> Completion:
    """The turn a policy that wrote ``text`` would have produced: its canonical token ids and the
    end-of-turn token (log-probs 0: no sampler drew them).

    Example:
        >>> end = tok.convert_tokens_to_ids("<|im_end|>")
        >>> turn = demonstration_completion(tok, "<answer>42</answer>", end)
        >>> tok.decode(turn.token_ids), turn.text, turn.finish_reason
        ('<answer>42</answer><|im_end|>', '<answer>42</answer>', 'stop')
    """
    ids = chat.encode(tokenizer, text) + [end_id]
    return Completion(ids, [0.0] * len(ids), text, "stop")


async def aplay_demonstration(
    envs: Any, demonstrator: Demonstrator, request: DemonstrationRequest, context: TurnContext
) -> Trajectory:
    """One demonstration on env ``request.slot``: reset to the task, then turn by turn as the async
    rollout plays an episode (the same budget, the same empty turn when it is spent)."""
    slot = request.slot
    _, info = await envs.areset_one(slot, options={"task_index": request.task_index})
    first_info = dict(info)
    traj = start_trajectory(context.tokenizer, first_info, group=request.group)
    traj.stats.demonstration = True
    while not traj.done:
        if len(traj.token_ids) >= context.max_total_tokens:
            traj.force_finish = True
        action, completion = "", None
        if not traj.force_finish:
            text = demonstrator(list(traj.messages), list(traj.tools), first_info)
            text = str(await text) if inspect.isawaitable(text) else str(text)
            completion = demonstration_completion(context.tokenizer, text, context.end_id)
            if add_completion(traj, completion, context.max_total_tokens):
                action = text
            else:
                completion = None
        _, reward, terminated, truncated, info = await envs.astep_one(slot, action)
        apply_step(traj, slot, (float(reward), bool(terminated), bool(truncated), info), completion, context)
    return traj


def play_demonstrations(
    envs: Any,
    tokenizer: Any,
    demonstrator: Demonstrator,
    requests: Sequence[DemonstrationRequest],
    *,
    max_total_tokens: int,
) -> list[Trajectory]:
    """Every request's episode (played concurrently, each on its own slot), in the requests' order."""
    if not requests:
        return []
    if not callable(getattr(envs, "areset_one", None)) or not callable(getattr(envs, "astep_one", None)):
        raise RolloutError(
            "guidance plays demonstrations on single env slots: the vector env needs areset_one and "
            "astep_one (docs/env_contract.md)"
        )
    if len({r.slot for r in requests}) != len(requests):
        raise RolloutError("two demonstrations were asked of one env slot")
    context = TurnContext(tokenizer, turn_end_id(tokenizer), max_total_tokens)

    async def play_all() -> list[Trajectory]:
        return list(
            await asyncio.gather(*(aplay_demonstration(envs, demonstrator, r, context) for r in requests))
        )

    return asyncio.run(play_all())


def replace_episodes(
    batch: RolloutBatch, replacements: dict[int, Trajectory], tokenizer: Any
) -> RolloutBatch:
    """``batch`` with row ``i`` replaced by the episode ``replacements[i]`` (same rows, same order,
    columns trimmed to the longest row)."""
    if not replacements:
        return batch
    rows = sorted(replacements)
    demos = to_batch([replacements[r] for r in rows], tokenizer, turn_end_id(tokenizer), {})
    if batch.timelines:  # the async rollout's per-episode timings: a demonstration has none
        demos.timelines = [None] * len(rows)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else turn_end_id(tokenizer))
    both = RolloutBatch.concat([batch, demos], pad_id)
    where = {row: len(batch) + k for k, row in enumerate(rows)}
    return both.select([where.get(i, i) for i in range(len(batch))])


__all__ = [
    "DemonstrationRequest",
    "Demonstrator",
    "aplay_demonstration",
    "demonstration_completion",
    "play_demonstrations",
    "replace_episodes",
]
