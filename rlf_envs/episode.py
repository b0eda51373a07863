"""One multi-turn tool-use episode: the logic shared by the single and the vector env.

An :class:`EpisodeState` holds the chat of one episode. :meth:`EpisodeState.step` parses an
assistant turn, runs its tool calls concurrently through a :class:`~rlf_envs.tools.toolbox.ToolBox`,
and on an answer (or at ``max_turns``) scores the episode with the task's async reward. It never
raises for anything the model wrote, any tool failure or a reward function's own exception.

Example:
    >>> import asyncio
    >>> from rlf_envs.tasks.base import FunctionTask, TaskInstance
    >>> from rlf_envs.tools.toolbox import ToolBox
    >>> task = FunctionTask("demo", [TaskInstance("0", "2+2?", "4")],
    ...                     reward_fn=lambda ep: float(ep.final_answer == "4"))
    >>> state = EpisodeState(task, ToolBox(), get_parser("hermes"))
    >>> obs, info = state.start(task.instances("train")[0], tools=[])
    >>> asyncio.run(state.step("<answer>4</answer>")).reward
    1.0
"""

from __future__ import annotations

import asyncio
import math
import traceback
from dataclasses import dataclass, field
from typing import Any

from rlf_envs.rewards.rules import extract_answer
from rlf_envs.tasks.base import Episode, Task, TaskInstance
from rlf_envs.tools.parsers import ParsedTurn, ToolCallParser, get_parser
from rlf_envs.tools.toolbox import ToolBox
from rlf_envs.tools.types import ErrorKind, ToolCall, ToolResult

__all__ = ["EpisodeState", "StepOutcome", "format_tool_results", "get_parser"]


@dataclass
class StepOutcome:
    obs: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)


def format_tool_results(results: list[ToolResult]) -> str:
    """The observation text for a tool turn: one ``<tool_response>`` block per call, in call order."""
    return "\n".join(f"<tool_response>\n{r.text}\n</tool_response>" for r in results)


def _failure_results(turn: ParsedTurn) -> list[ToolResult]:
    results = []
    for failure in turn.failures:
        call = ToolCall(name="invalid_tool_call", arguments={"raw": failure.raw[:500]})
        results.append(ToolResult.failure(call, failure.kind, failure.message))
    return results


class EpisodeState:
    """The chat and counters of one episode, stepped on the env's event loop."""

    def __init__(
        self,
        task: Task,
        toolbox: ToolBox,
        parser: ToolCallParser,
        *,
        max_turns: int | None = None,
        answer_tag: str = "answer",
    ) -> None:
        self.task = task
        self.toolbox = toolbox
        self.parser = parser
        self.max_turns = max_turns if max_turns is not None else task.max_turns
        self.answer_tag = answer_tag
        self.instance: TaskInstance | None = None
        self.messages: list[dict[str, Any]] = []
        self.tool_records: list[dict[str, Any]] = []
        self.turns = 0
        self.done = False
        self.last_terminated = False
        self.last_truncated = False

    def start(self, instance: TaskInstance, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        """Begin an episode on ``instance``; returns the reset ``(obs, info)``."""
        self.instance = instance
        prompt = self.task.user_prompt(instance)
        self.messages = [
            {"role": "system", "content": self.task.system_prompt},
            {"role": "user", "content": prompt},
        ]
        self.tool_records = []
        self.turns = 0
        self.done = False
        self.last_terminated = self.last_truncated = False
        info = {"messages": [dict(m) for m in self.messages], "tools": tools, "task_id": instance.id}
        return prompt, info

    async def step(self, action: str) -> StepOutcome:
        """Apply one assistant turn."""
        if self.instance is None:
            raise RuntimeError("step() before reset()")
        if self.done:
            raise RuntimeError("step() after the episode ended: reset() first")
        if not isinstance(action, str):
            action = "" if action is None else str(action)
        self.turns += 1
        answer = extract_answer(action, self.answer_tag)
        turn = self.parser.parse(action)
        if answer is not None or not turn.attempted:
            self.messages.append({"role": "assistant", "content": action})
            return await self._finish(action, answer, terminated=True, info={})

        results = await self.toolbox.call_many(turn.calls)
        results = [self.toolbox.fit(r) for r in _failure_results(turn)] + results
        self.messages.append(
            {"role": "assistant", "content": turn.content, "tool_calls": [c.to_openai() for c in turn.calls]}
        )
        tool_messages = [
            {"role": "tool", "name": r.call.name, "tool_call_id": r.call.id, "content": r.text}
            for r in results
        ]
        self.messages.extend(tool_messages)
        records = [r.record() for r in results]
        self.tool_records.extend(records)
        info: dict[str, Any] = {
            "tool_messages": tool_messages,
            "tool_calls": records,
            "errors": [r.error_kind.value for r in results if r.error_kind is not None],
        }
        obs = format_tool_results(results)
        if self.turns >= self.max_turns:
            return await self._finish(action, None, terminated=False, info=info, obs=obs)
        info["messages"] = [dict(m) for m in self.messages]
        return StepOutcome(obs=obs, reward=0.0, terminated=False, truncated=False, info=info)

    async def _finish(
        self, action: str, answer: str | None, *, terminated: bool, info: dict[str, Any], obs: str = ""
    ) -> StepOutcome:
        self.done = True
        self.last_terminated, self.last_truncated = terminated, not terminated
        episode = Episode(
            task=self.instance,  # type: ignore[arg-type]
            messages=[dict(m) for m in self.messages],
            final_response=action,
            final_answer=answer,
            tool_calls=list(self.tool_records),
            turns=self.turns,
            terminated=terminated,
            truncated=not terminated,
        )
        reward, reward_info = await self._score(episode)
        info.update(
            messages=episode.messages,
            answer=answer,
            reward_info=reward_info,
            episode_stats={
                "turns": self.turns,
                "tool_calls": len(self.tool_records),
                "tool_errors": sum(1 for r in self.tool_records if not r["ok"]),
            },
        )
        info.setdefault("tool_messages", [])
        info.setdefault("tool_calls", [])
        info.setdefault("errors", [])
        return StepOutcome(obs=obs, reward=reward, terminated=terminated, truncated=not terminated, info=info)

    async def _score(self, episode: Episode) -> tuple[float, dict[str, Any]]:
        try:
            value = await self.task.reward(episode)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a reward bug is reported, never fatal to the batch
            return 0.0, {
                "reward": 0.0,
                "reward_error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=3),
            }
        if isinstance(value, dict):
            info = dict(value)
            reward = info.get("reward", 0.0)
        else:
            reward, info = value, {}
        try:
            reward = float(reward)
        except (TypeError, ValueError):
            return 0.0, {**info, "reward": 0.0, "reward_error": f"reward is not a number: {reward!r}"}
        if math.isnan(reward):
            return 0.0, {**info, "reward": 0.0, "reward_error": "reward is NaN"}
        info["reward"] = reward
        return reward, info


def error_kinds() -> list[str]:
    """Every error kind an env can report in ``info["errors"]``."""
    return [kind.value for kind in ErrorKind]
