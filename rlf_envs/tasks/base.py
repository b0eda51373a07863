"""What a task is: its instances, its prompts, its default tools and its reward.

An env (single or vector) runs episodes of a :class:`Task`. A task never touches the event loop
or the tool servers itself: the env starts the tools it declares and calls :meth:`Task.reward`
on finished episodes, concurrently across the batch.

Example:
    >>> task = FunctionTask(
    ...     name="echo", instances=[TaskInstance(id="0", question="Say hi", answer="hi")],
    ...     reward_fn=lambda ep: float(ep.final_answer == "hi"))
    >>> task.user_prompt(task.instances("train")[0])
    'Say hi'
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RewardValue = float | dict[str, Any]
RewardFn = Callable[["Episode"], RewardValue | Awaitable[RewardValue]]


@dataclass(frozen=True)
class TaskInstance:
    """One question with its gold answer (any value the task's reward understands)."""

    id: str
    question: str
    answer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """A finished (or truncated) episode, as reward functions see it."""

    task: TaskInstance
    messages: list[dict[str, Any]]
    final_response: str
    final_answer: str | None
    tool_calls: list[dict[str, Any]]
    turns: int
    terminated: bool
    truncated: bool


class Task:
    """Base class of a task. Subclasses override what differs; defaults suit a QA task."""

    name: str = "task"
    system_prompt: str = "You are a helpful assistant."
    max_turns: int = 4

    # Subclasses provide their instances per split here (a dict, or a cached property).
    _splits: Mapping[str, Sequence[TaskInstance]]

    def instances(self, split: str) -> Sequence[TaskInstance]:
        try:
            return self._splits[split]
        except KeyError:
            raise KeyError(
                f"task {self.name!r} has no split {split!r}; it has {sorted(self._splits)}"
            ) from None

    def splits(self) -> list[str]:
        return list(self._splits)

    def user_prompt(self, instance: TaskInstance) -> str:
        return instance.question

    def mcp_config(self) -> dict[str, Any] | None:
        """The MCP servers this task needs by default (``{"mcpServers": {...}}``), or None."""
        return None

    def python_tools(self) -> list[Callable[..., Any]]:
        """Plain (sync or async, typed) functions exposed as tools by default."""
        return []

    async def reward(self, episode: Episode) -> RewardValue:
        raise NotImplementedError


async def resolve_reward(fn: RewardFn, episode: Episode) -> RewardValue:
    """Call a sync or async reward function and return its value."""
    value = fn(episode)
    if inspect.isawaitable(value):
        value = await value
    return value


class FunctionTask(Task):
    """A task assembled from plain data and a reward callable (what ``RLF/ToolUse-v0`` builds)."""

    def __init__(
        self,
        name: str,
        instances: Sequence[TaskInstance] | dict[str, Sequence[TaskInstance]],
        reward_fn: RewardFn,
        *,
        system_prompt: str | None = None,
        max_turns: int = 4,
        mcp_servers: dict[str, Any] | None = None,
        python_tools: Sequence[Callable[..., Any]] = (),
    ) -> None:
        self.name = name
        self._splits = dict(instances) if isinstance(instances, dict) else {"train": list(instances)}
        self._reward_fn = reward_fn
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self.max_turns = max_turns
        self._mcp_servers = mcp_servers
        self._python_tools = list(python_tools)

    def instances(self, split: str) -> Sequence[TaskInstance]:
        if split == "test" and "test" not in self._splits and "train" in self._splits:
            return self._splits["train"]  # a task list without a test split evaluates on its tasks
        return super().instances(split)

    def mcp_config(self) -> dict[str, Any] | None:
        return self._mcp_servers

    def python_tools(self) -> list[Callable[..., Any]]:
        return self._python_tools

    async def reward(self, episode: Episode) -> RewardValue:
        return await resolve_reward(self._reward_fn, episode)
