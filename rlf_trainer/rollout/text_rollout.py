"""The text rollout: an agent that answers in text (e.g. an OpenAI-compatible endpoint) plays one episode.

The token rollouts (:mod:`rlf_trainer.rollout.lockstep`, :mod:`rlf_trainer.rollout.async_rollout`)
keep the token ids of every turn, which needs the model's tokenizer; an endpoint gives back text
only. Here each turn is the agent's reply to the chat so far, stepped into the env as its action
(tool calls as ``<tool_call>`` blocks, the env's parser reads them), and the episode's
:class:`~rlf_trainer.rollout.trajectory.EpisodeStats` come from the env's infos through
:func:`~rlf_trainer.rollout.trajectory.record_step`, as in the token rollouts: turns, tool calls,
tool errors, finish reasons, reward and correctness mean the same. Token counts are the agent's own
(an endpoint's ``usage``), 0 when it reports none.

Example:
    >>> import asyncio, gymnasium as gym, rlf_envs
    >>> envs = gym.make_vec("RLF/ToolUse-v0", num_envs=1, autoreset_mode="Disabled", reward="exact_match",
    ...                     tasks=[{"id": "t0", "question": "Say ping.", "answer": "ping"}])
    >>> async def agent(messages, tools, seed):
    ...     return TextTurn("<answer>ping</answer>", completion_tokens=5)
    >>> stats, transcript = asyncio.run(play_text_episode(envs, 0, agent, task_index=0))
    >>> stats.reward, stats.correct, stats.finish_reason, stats.response_length, transcript[-1]["role"]
    (1.0, True, 'answer', 5, 'assistant')
    >>> envs.close()
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from rlf_envs.info_keys import MESSAGES, TASK_ID, TASK_METADATA, TOOLS
from rlf_trainer.rollout.trajectory import EpisodeStats, RolloutError, Trajectory, record_step
from rlf_trainer.seeds import SeedKey

Message = dict[str, Any]


@dataclass(frozen=True)
class TextTurn:
    """One assistant turn of a text agent: the text, why it stopped (``stop`` or ``length``, as a
    policy's turns), and the prompt and completion tokens when the agent knows them."""

    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0


# agent(messages, tools, seed) -> the next assistant turn; seed is the request's sampling seed (or None)
TextAgent = Callable[[list[Message], list[dict[str, Any]], int | None], Awaitable[TextTurn]]


async def play_text_episode(
    envs: Any, slot: int, agent: TextAgent, task_index: int, seeds: SeedKey | None = None
) -> tuple[EpisodeStats, list[Message]]:
    """Play instance ``task_index`` (of the env's current split) in env ``slot`` until it ends.

    The request of turn ``t`` is seeded ``seeds.for_request(0, t)``: ``seeds`` names this episode
    (its ``first_episode``), so an episode gets the seeds a token rollout gives it.
    Returns the episode's stats and its transcript (the env's messages).
    """
    if not callable(getattr(envs, "astep_one", None)) or not callable(getattr(envs, "areset_one", None)):
        raise RolloutError(
            "the text rollout needs a vector env with areset_one/astep_one (docs/env_contract.md)"
        )
    _, info = await envs.areset_one(slot, options={"task_index": int(task_index)})
    messages, tools = list(info.get(MESSAGES) or []), list(info.get(TOOLS) or [])
    if not messages:
        raise RolloutError("reset info has no 'messages': the env does not follow the env contract")
    stats = EpisodeStats(
        task_id=info.get(TASK_ID), group=0, task_metadata=dict(info.get(TASK_METADATA) or {})
    )
    traj = Trajectory(token_ids=[], loss_mask=[], logprobs=[], stats=stats, messages=messages, tools=tools)
    turn = 0
    while not traj.done:
        reply = await agent(list(traj.messages), tools, None if seeds is None else seeds.for_request(0, turn))
        count_turn_tokens(stats, reply, first=turn == 0)
        _, reward, terminated, truncated, step_info = await envs.astep_one(slot, reply.text)
        record_step(traj, slot, (float(reward), bool(terminated), bool(truncated), step_info))
        turn += 1
    return stats, traj.messages


def count_turn_tokens(stats: EpisodeStats, reply: TextTurn, *, first: bool) -> None:
    """Add a text turn's tokens and finish reason to the episode's stats.

    Example:
        >>> stats = EpisodeStats(task_id="t0", group=0)
        >>> count_turn_tokens(stats, TextTurn("a", "length", prompt_tokens=50, completion_tokens=8), first=True)
        >>> count_turn_tokens(stats, TextTurn("b", prompt_tokens=70, completion_tokens=4), first=False)
        >>> stats.prompt_length, stats.response_length, stats.total_length, stats.turn_finish_reasons
        (50, 12, 74, ['length', 'stop'])
    """
    if first:
        stats.prompt_length = reply.prompt_tokens
    stats.response_length += reply.completion_tokens
    stats.total_length = reply.prompt_tokens + reply.completion_tokens  # the whole chat, as last sent
    stats.turn_finish_reasons.append(reply.finish_reason)


__all__ = ["TextAgent", "TextTurn", "count_turn_tokens", "play_text_episode"]
