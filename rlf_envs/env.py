"""ToolEnv: one multi-turn tool-use episode at a time behind Gymnasium's ``Env`` API.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> env = gym.make("RLF/DeepSearch-v0")                     # doctest: +SKIP
    >>> obs, info = env.reset(seed=0)                           # doctest: +SKIP
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     '<tool_call>{"name": "search", "arguments": {"query": "Velmora"}}</tool_call>')  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from rlf_envs.dialogue.flags import SimChecks
from rlf_envs.dialogue.runner import DEFAULT_SIM_TIMEOUT_S, SimulatorRunner
from rlf_envs.dialogue.simulator import resolve_user_simulator
from rlf_envs.episode import EpisodeState
from rlf_envs.runtime import LoopThread
from rlf_envs.spaces import UnicodeText
from rlf_envs.task import Task, split_hidden_arguments
from rlf_envs.tools.parsers import ToolCallParser, get_parser
from rlf_envs.tools.toolbox import ToolBox
from rlf_envs.types import TaskInstance

DEFAULT_MAX_TEXT_LENGTH = 1_000_000


@dataclass(frozen=True)
class ToolSettings:
    """How an env reaches its tools; shared by :class:`ToolEnv` and the vector env."""

    mcp_servers: dict[str, Any] | str | os.PathLike[str] | None = None
    python_tools: Sequence[Callable[..., Any]] = ()
    max_result_chars: int | None = 4000
    max_calls_per_turn: int | None = 16
    tool_timeout_s: float = 30.0

    def build(self, task: Task) -> ToolBox:
        """The toolbox for ``task``: its default servers unless overridden, plus extra functions."""
        servers = self.mcp_servers if self.mcp_servers is not None else task.mcp_config()
        return ToolBox(
            mcp_servers=servers,
            python_tools=[*task.python_tools(), *self.python_tools],
            max_result_chars=self.max_result_chars,
            max_calls_per_turn=self.max_calls_per_turn,
            default_timeout_s=self.tool_timeout_s,
        )

    def reset_info(self, task: Task) -> dict[str, Any]:
        """What :meth:`Task.env_info` adds to reset infos: only while the task's own servers run."""
        return dict(task.env_info()) if self.mcp_servers is None else {}


def build_user_simulator(
    task: Task, spec: Any = None, checks: SimChecks | Mapping[str, Any] | bool | None = None,
    timeout_s: float = DEFAULT_SIM_TIMEOUT_S,
) -> SimulatorRunner | None:  # fmt: skip
    """The env's user simulator: ``spec`` (None: the task's default; False: none) with its checks.

    ``checks``: a :class:`SimChecks`, a dict of its fields, True/None (the defaults) or False (off).

    Example:
        >>> from rlf_envs.task import FunctionTask
        >>> task = FunctionTask("t", [], lambda ep: 0.0)
        >>> build_user_simulator(task) is None, type(build_user_simulator(task, lambda r: "ok")).__name__
        (True, 'SimulatorRunner')
    """
    simulator = resolve_user_simulator(task.default_user_simulator() if spec is None else spec)
    if simulator is None:
        return None
    if checks is None or checks is True:
        checks = SimChecks()
    elif checks is False:
        checks = SimChecks(enabled=False)
    elif isinstance(checks, Mapping):
        checks = SimChecks(**dict(checks))
    return SimulatorRunner(simulator, checks, timeout_s=timeout_s)


def pick_instance(task: Task, split: str, index: int | None, rng: Any) -> TaskInstance:
    """The instance at ``index`` of ``split`` (wrapping around), or one drawn with ``rng``."""
    instances = task.instances(split)
    if not instances:
        raise ValueError(f"task {task.name!r} has no instances in split {split!r}")
    if index is None:
        index = int(rng.integers(len(instances)))
    return instances[int(index) % len(instances)]


class ToolEnv(gym.Env[str, str]):
    """A text env: observations are prompts / tool results, actions are assistant turns.

    Tools start lazily on the first ``reset`` and live until ``close``. See docs/env_contract.md.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self,
        task: Task,
        *,
        split: str = "train",
        mcp_servers: dict[str, Any] | str | os.PathLike[str] | None = None,
        python_tools: Sequence[Callable[..., Any]] = (),
        parser: str | ToolCallParser = "hermes",
        max_turns: int | None = None,
        max_result_chars: int | None = 4000,
        max_calls_per_turn: int | None = 16,
        tool_timeout_s: float = 30.0,
        max_text_length: int = DEFAULT_MAX_TEXT_LENGTH,
        render_mode: str | None = None,
        user_simulator: Any = None,
        sim_checks: SimChecks | Mapping[str, Any] | bool | None = None,
        sim_timeout_s: float = DEFAULT_SIM_TIMEOUT_S,
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        self.task = task
        self.split = split
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_text_length)
        self.action_space = UnicodeText(max_text_length)
        self._tool_settings = ToolSettings(
            mcp_servers, python_tools, max_result_chars, max_calls_per_turn, tool_timeout_s
        )
        self._parser = get_parser(parser)
        self._max_turns = max_turns
        self._user_simulator = build_user_simulator(task, user_simulator, sim_checks, sim_timeout_s)
        self._loop: LoopThread | None = None
        self._toolbox: ToolBox | None = None
        self._state: EpisodeState | None = None

    def _ensure_started(self) -> EpisodeState:
        if self._state is None:
            self._loop = LoopThread(f"rlf-{self.task.name}")
            toolbox = self._tool_settings.build(self.task)
            try:
                self._loop.run(toolbox.start())
            except BaseException:
                self._loop.run(toolbox.aclose())
                self._loop.close()
                self._loop = None
                raise
            self._toolbox = toolbox
            self._state = EpisodeState(
                self.task, toolbox, self._parser, max_turns=self._max_turns,
                user_simulator=self._user_simulator,
            )  # fmt: skip
        return self._state

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' schemas in OpenAI function format (starts the tools if needed).

        Parameters the task fills in itself (:attr:`Task.hidden_arguments`) are left out.
        """
        self._ensure_started()
        assert self._toolbox is not None
        return split_hidden_arguments(self._toolbox.openai_tools(), self.task.hidden_arguments)[0]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        state = self._ensure_started()
        self.split = options.get("split", self.split)
        instance = pick_instance(self.task, self.split, options.get("task_index"), self.np_random)
        assert self._toolbox is not None
        obs, info = state.start(instance, self._toolbox.openai_tools())
        return obs, {**self._tool_settings.reset_info(self.task), **info}

    def num_tasks(self, split: str | None = None) -> int:
        """How many task instances ``split`` (default: the current one) holds."""
        return len(self.task.instances(split or self.split))

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._state is None or self._loop is None:
            raise RuntimeError("step() before reset()")
        outcome = self._loop.run(self._state.step(action))
        return outcome.obs, outcome.reward, outcome.terminated, outcome.truncated, outcome.info

    async def astep(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Async ``step`` usable from any event loop."""
        if self._state is None or self._loop is None:
            raise RuntimeError("step() before reset()")
        outcome = await self._loop.arun(self._state.step(action))
        return outcome.obs, outcome.reward, outcome.terminated, outcome.truncated, outcome.info

    def render(self) -> str | None:
        if self.render_mode != "ansi" or self._state is None:
            return None
        return render_transcript(self._state.messages)

    def close(self) -> None:
        if self._loop is not None and not self._loop.closed:
            if self._state is not None:
                self._state.close_episode()
            if self._toolbox is not None:
                self._loop.run(self._toolbox.aclose())
            if self._user_simulator is not None:
                self._loop.run(self._user_simulator.aclose())
            self._loop.close()
        self._loop = None
        self._toolbox = None
        self._state = None
        super().close()


def render_transcript(messages: list[dict[str, Any]]) -> str:
    """A readable transcript of a chat (what ``render_mode="ansi"`` returns)."""
    lines = []
    for message in messages:
        content = message.get("content") or ""
        calls = message.get("tool_calls") or []
        head = f"[{message['role']}" + (f" {message['name']}" if message.get("name") else "") + "]"
        lines.append(f"{head} {content}".rstrip())
        for call in calls:
            fn = call["function"]
            lines.append(f"    -> {fn['name']}({fn['arguments']})")
    return "\n".join(lines)
