"""The task contract: what a task is: its instances, its prompts, its default tools and its reward.

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlf_envs.types import Episode, RewardFn, RewardValue, TaskInstance

__all__ = [
    "DialogueTask",
    "FunctionTask",
    "Task",
    "default_user_simulator_for",
    "persona_instructions",
    "resolve_reward",
    "split_hidden_arguments",
    "user_instructions_for",
]


class Task:
    """Base class of a task. Subclasses override what differs; defaults suit a QA task."""

    name: str = "task"
    system_prompt: str = "You are a helpful assistant."
    max_turns: int = 4
    # A process reward: the step reward of a tool turn whose calls all succeeded (0: rewards only
    # at the end). The episode's return is then the task reward plus these turn rewards.
    tool_success_reward: float = 0.0
    # Tools whose successful call ends the episode (e.g. ``transfer_to_human_agents``).
    terminating_tools: frozenset[str] = frozenset()
    # Tool arguments the env fills in from :meth:`open_episode` (never shown to or written by the
    # model): e.g. the token of the episode's own database copy.
    hidden_arguments: tuple[str, ...] = ()

    # Every split's instances by name: subclasses set it (a dict, or a cached property).
    split_instances: Mapping[str, Sequence[TaskInstance]]

    def instances(self, split: str) -> Sequence[TaskInstance]:
        """The instances of ``split``; a KeyError names the splits there are."""
        try:
            return self.split_instances[split]
        except KeyError:
            raise KeyError(
                f"task {self.name!r} has no split {split!r}; it has {sorted(self.split_instances)}"
            ) from None

    def splits(self) -> list[str]:
        """The names of the task's splits."""
        return list(self.split_instances)

    def user_prompt(self, instance: TaskInstance) -> str:
        return instance.question

    def mcp_config(self) -> dict[str, Any] | None:
        """The MCP servers this task needs by default (``{"mcpServers": {...}}``), or None."""
        return None

    def python_tools(self) -> list[Callable[..., Any]]:
        """Plain (sync or async, typed) functions exposed as tools by default."""
        return []

    def env_info(self) -> dict[str, Any]:
        """Facts about this task's own tools that the env adds to every reset ``info``.

        E.g. ``{"sandbox": {"isolation": "bwrap"}}``: how the task's tool server isolates code. The
        env merges it only when it runs the task's own ``mcp_config()``, not servers the caller
        passed (the task knows nothing about those).
        """
        return {}

    def open_episode(self, instance: TaskInstance) -> dict[str, Any]:
        """Per-episode state for ``instance``: the values of :attr:`hidden_arguments` (default ``{}``)."""
        return {}

    def close_episode(self, episode_args: dict[str, Any]) -> None:
        """Release what :meth:`open_episode` made (called once per opened episode)."""

    def turn_reward(
        self, instance: TaskInstance, messages: Sequence[Mapping[str, Any]], calls_ok: Sequence[bool]
    ) -> float:
        """The step reward of a tool turn (a process reward; the episode's return adds them up).

        ``messages`` is the chat so far, ending with this turn's assistant message and its tool
        results; ``calls_ok[i]`` says whether its ``i``-th call succeeded. The default pays
        :attr:`tool_success_reward` when every call did; a task overrides it to reward (or charge)
        what a turn found, e.g. DeepSearch's ``redundant_search_cost``.

        Example:
            >>> task = FunctionTask("t", [], reward_fn=lambda ep: 0.0, tool_success_reward=0.1)
            >>> task.turn_reward(TaskInstance("0", "q", "a"), [], [True, True]), task.turn_reward(None, [], [True, False])
            (0.1, 0.0)
        """
        if self.tool_success_reward and calls_ok and all(calls_ok):
            return float(self.tool_success_reward)
        return 0.0

    async def reward(self, episode: Episode) -> RewardValue:
        raise NotImplementedError


def split_hidden_arguments(
    tools: Sequence[dict[str, Any]], hidden: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, frozenset[str]]]:
    """Model-facing tool schemas without the ``hidden`` parameters, and which tool takes which.

    Example:
        >>> tool = {"type": "function", "function": {"name": "get", "parameters": {
        ...     "type": "object", "properties": {"id": {}, "episode": {}}, "required": ["id", "episode"]}}}
        >>> visible, takes = split_hidden_arguments([tool], ["episode"])
        >>> visible[0]["function"]["parameters"], takes
        ({'type': 'object', 'properties': {'id': {}}, 'required': ['id']}, {'get': frozenset({'episode'})})
    """
    if not hidden:
        return list(tools), {}
    visible, takes = [], {}
    for tool in tools:
        function = tool.get("function", {})
        params = function.get("parameters") or {}
        names = frozenset(h for h in hidden if h in (params.get("properties") or {}))
        if not names:
            visible.append(tool)
            continue
        takes[function.get("name", "")] = names
        stripped = dict(params)
        stripped["properties"] = {k: v for k, v in params["properties"].items() if k not in names}
        if "required" in params:
            stripped["required"] = [r for r in params["required"] if r not in names]
        visible.append({**tool, "function": {**function, "parameters": stripped}})
    return visible, takes


class DialogueTask(Task):
    """A task whose episodes talk with a (simulated) user: the hooks only dialogue tasks have.

    Any env takes ``user_simulator=`` whatever its task; a task that is not a ``DialogueTask``
    then gets the defaults below (:func:`persona_instructions`, no default simulator).
    """

    def user_instructions(self, instance: TaskInstance) -> str:
        """The hidden persona/goal a user simulator plays for ``instance`` (default: :func:`persona_instructions`)."""
        return persona_instructions(instance)

    def default_user_simulator(self) -> Any:
        """The user simulator the env uses when none is passed (default None: no user turns)."""
        return None


def persona_instructions(instance: TaskInstance) -> str:
    """An instance's ``user_instructions`` (a task dict's key), after its ``persona``.

    Example:
        >>> persona_instructions(TaskInstance("0", "Hi", metadata={"persona": "Ann.", "user_instructions": "Cancel."}))
        'Ann.\\nCancel.'
    """
    parts = [instance.metadata.get("persona"), instance.metadata.get("user_instructions")]
    return "\n".join(str(p) for p in parts if p)


def user_instructions_for(task: Task, instance: TaskInstance) -> str:
    """What a user simulator plays for ``instance`` of ``task``: the dialogue hook, else the persona."""
    if isinstance(task, DialogueTask):
        return task.user_instructions(instance)
    return persona_instructions(instance)


def default_user_simulator_for(task: Task) -> Any:
    """The task's own user simulator (only a :class:`DialogueTask` has one), or None."""
    return task.default_user_simulator() if isinstance(task, DialogueTask) else None


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
        tool_success_reward: float = 0.0,
    ) -> None:
        self.name = name
        self.tool_success_reward = float(tool_success_reward)
        self.split_instances = dict(instances) if isinstance(instances, dict) else {"train": list(instances)}
        self._reward_fn = reward_fn
        if system_prompt is not None:
            self.system_prompt = system_prompt
        self.max_turns = max_turns
        self._mcp_servers = mcp_servers
        self._python_tools = list(python_tools)

    def instances(self, split: str) -> Sequence[TaskInstance]:
        if split == "test" and "test" not in self.split_instances and "train" in self.split_instances:
            return self.split_instances["train"]  # a task list without a test split evaluates on its tasks
        return super().instances(split)

    def mcp_config(self) -> dict[str, Any] | None:
        return self._mcp_servers

    def python_tools(self) -> list[Callable[..., Any]]:
        return self._python_tools

    async def reward(self, episode: Episode) -> RewardValue:
        return await resolve_reward(self._reward_fn, episode)
