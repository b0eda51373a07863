"""One multi-turn tool-use episode: the logic shared by the single and the vector env.

An :class:`EpisodeState` holds the chat of one episode. :meth:`EpisodeState.step` parses an
assistant turn, runs its tool calls concurrently through a :class:`~rlf_envs.tools.toolbox.ToolBox`,
and on an answer (or at ``max_turns``) scores the episode with the task's async reward. It never
raises for anything the model wrote, any tool failure or a reward function's own exception.

With a user simulator (:mod:`rlf_envs.dialogue`), a turn with neither a tool call nor an answer is
a message to the user: the simulator's reply is the next observation (``info["user_message"]``),
its stop marker ends and scores the episode, and a failed or flagged reply ends it with
``info["sim_error"]`` (truncated, still scored). A successful call of one of the task's
``terminating_tools`` ends the episode too. Tools that take the task's ``hidden_arguments`` get
them from :meth:`Task.open_episode` (the model never sees or writes them).

Example:
    >>> import asyncio
    >>> from rlf_envs.core.task import FunctionTask
    >>> from rlf_envs.types import TaskInstance
    >>> from rlf_envs.tools.parsers import get_parser
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
import copy
import dataclasses
import math
import traceback
from dataclasses import dataclass, field
from typing import Any

from rlf_envs.answers import extract_answer
from rlf_envs.core.task import Task, split_hidden_arguments, user_instructions_for
from rlf_envs.dialogue.runner import SimulatorRunner
from rlf_envs.dialogue.simulator import UserTurnRequest
from rlf_envs.info_keys import (
    ANSWER,
    ERRORS,
    MESSAGES,
    REWARD_INFO,
    SIM_ERROR,
    SIM_ERROR_MESSAGE,
    SIM_RAW,
    TASK_ID,
    TASK_METADATA,
    TOOL_CALLS,
    TOOL_MESSAGES,
    TOOLS,
    TURN_REWARD,
    USER_MESSAGE,
    USER_STOP,
)
from rlf_envs.tools.parsers import ParsedTurn, ToolCallParser
from rlf_envs.tools.toolbox import ToolBox
from rlf_envs.types import Episode, TaskInstance, ToolCall, ToolResult

__all__ = ["EpisodeState", "StepOutcome", "format_tool_results"]


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
        user_simulator: SimulatorRunner | None = None,
    ) -> None:
        self.task = task
        self.toolbox = toolbox
        self.parser = parser
        self.max_turns = max_turns if max_turns is not None else task.max_turns
        self.answer_tag = answer_tag
        self.user_simulator = user_simulator
        self.user_turns = 0
        self.sim_error: str | None = None
        self.episode_args: dict[str, Any] = {}
        self._episode_open = False
        self._hidden_by_tool: dict[str, frozenset[str]] = {}
        self.instance: TaskInstance | None = None
        self.messages: list[dict[str, Any]] = []
        self.tool_records: list[dict[str, Any]] = []
        self.turns = 0
        self.done = False
        self.last_terminated = False
        self.last_truncated = False

    def start(self, instance: TaskInstance, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
        """Begin an episode on ``instance``; returns the reset ``(obs, info)``."""
        self.close_episode()
        self.instance = instance
        prompt = self.task.user_prompt(instance)
        tools, self._hidden_by_tool = split_hidden_arguments(tools, self.task.hidden_arguments)
        self.episode_args = dict(self.task.open_episode(instance))
        self._episode_open = True
        self.user_turns = 0
        self.sim_error = None
        self.messages = [
            {"role": "system", "content": self.task.system_prompt},
            {"role": "user", "content": prompt},
        ]
        self.tool_records = []
        self.turns = 0
        self.done = False
        self.last_terminated = self.last_truncated = False
        info = {MESSAGES: [dict(m) for m in self.messages], TOOLS: tools, TASK_ID: instance.id,
                TASK_METADATA: copy.deepcopy(dict(instance.metadata))}  # fmt: skip
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
        if answer is None and not turn.attempted and self.user_simulator is not None:
            return await self._user_turn(action)
        if answer is not None or not turn.attempted:
            self.messages.append({"role": "assistant", "content": action})
            return await self._finish(action, answer, terminated=True, info={})

        results = await self._call_tools(turn.calls)
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
            TOOL_MESSAGES: tool_messages,
            TOOL_CALLS: records,
            ERRORS: [r.error_kind.value for r in results if r.error_kind is not None],
        }
        obs = format_tool_results(results)
        turn_reward = float(
            self.task.turn_reward(self.instance, self.messages, [r.error_kind is None for r in results])
        )
        info[TURN_REWARD] = turn_reward
        ends = any(r.ok and r.call.name in self.task.terminating_tools for r in results)
        if ends or self.turns >= self.max_turns:
            outcome = await self._finish(action, None, terminated=ends, info=info, obs=obs)
            outcome.reward += turn_reward
            return outcome
        info[MESSAGES] = [dict(m) for m in self.messages]
        return StepOutcome(obs=obs, reward=turn_reward, terminated=False, truncated=False, info=info)

    async def _call_tools(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Run a turn's calls, the episode's hidden arguments filled in (and kept out of the records)."""
        if not self._hidden_by_tool:
            return await self.toolbox.call_many(calls)
        bound = []
        for call in calls:
            names = self._hidden_by_tool.get(call.name, frozenset())
            extra = {k: v for k, v in self.episode_args.items() if k in names}
            bound.append(dataclasses.replace(call, arguments={**call.arguments, **extra}) if extra else call)
        results = await self.toolbox.call_many(bound)
        return [dataclasses.replace(r, call=c) for r, c in zip(results, calls, strict=True)]

    async def _user_turn(self, action: str) -> StepOutcome:
        """The agent spoke to the user: the simulator answers, stops the episode, or is flagged."""
        assert self.user_simulator is not None and self.instance is not None
        self.messages.append({"role": "assistant", "content": action})
        if self.turns >= self.max_turns:
            return await self._finish(action, None, terminated=False, info={})
        request = UserTurnRequest(
            instance=self.instance,
            instructions=user_instructions_for(self.task, self.instance),
            messages=[dict(m) for m in self.messages],
            turn=self.user_turns,
        )
        reply = await self.user_simulator.next_turn(request)
        if reply.flag is not None:
            self.sim_error = reply.flag.kind.value
            info = {SIM_ERROR: self.sim_error, SIM_ERROR_MESSAGE: reply.flag.message, SIM_RAW: reply.raw}
            obs = f"Error (sim_error {self.sim_error}): {reply.flag.message}"
            return await self._finish(action, None, terminated=False, info=info, obs=obs)
        self.user_turns += 1
        user_message = {"role": "user", "content": reply.text}
        if reply.stop:
            if reply.text:
                self.messages.append(user_message)
            return await self._finish(action, None, terminated=True, info={USER_STOP: True})
        self.messages.append(user_message)
        info: dict[str, Any] = {
            USER_MESSAGE: dict(user_message),
            TOOL_MESSAGES: [],
            TOOL_CALLS: [],
            ERRORS: [],
            TURN_REWARD: 0.0,
            MESSAGES: [dict(m) for m in self.messages],
        }
        return StepOutcome(obs=reply.text, reward=0.0, terminated=False, truncated=False, info=info)

    def close_episode(self) -> None:
        """Release the episode's per-episode state (once; also when an unfinished episode is reset)."""
        if self._episode_open:
            self._episode_open = False
            try:
                self.task.close_episode(self.episode_args)
            except Exception:  # cleanup trouble must not break the next episode
                traceback.print_exc(limit=2)

    async def _finish(
        self, action: str, answer: str | None, *, terminated: bool, info: dict[str, Any], obs: str = ""
    ) -> StepOutcome:
        self.done = True
        self.last_terminated, self.last_truncated = terminated, not terminated
        episode = Episode(
            instance=self.instance,  # type: ignore[arg-type]
            messages=[dict(m) for m in self.messages],
            final_response=action,
            final_answer=answer,
            tool_calls=list(self.tool_records),
            turns=self.turns,
            terminated=terminated,
            truncated=not terminated,
            user_turns=self.user_turns,
            sim_error=self.sim_error,
            episode_args=dict(self.episode_args),
        )
        try:
            reward, reward_info = await self._score(episode)
        finally:
            self.close_episode()
        info.update({MESSAGES: episode.messages, ANSWER: answer, REWARD_INFO: reward_info})
        for key in (TOOL_MESSAGES, TOOL_CALLS, ERRORS):
            info.setdefault(key, [])
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
