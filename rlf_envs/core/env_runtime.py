"""The runtime both env classes sit on: one loop, one toolbox, one user simulator, N episodes.

:class:`~rlf_envs.core.env.ToolEnv` is a view of an :class:`EnvRuntime` with one episode and
:class:`~rlf_envs.core.vector.ToolVectorEnv` of one with ``num_envs``; the keyword arguments they share
(:class:`EnvSettings`), starting and closing the tools, picking an instance and ``num_tasks`` live
here once. The env classes add only what differs: Gymnasium's seeding, autoreset and batching.

Example:
    >>> from rlf_envs.core.task import FunctionTask
    >>> from rlf_envs.types import TaskInstance
    >>> task = FunctionTask("demo", [TaskInstance("0", "2+2?", "4")], lambda ep: float(ep.final_answer == "4"))
    >>> runtime = EnvRuntime(task, 2, EnvSettings(max_turns=2))
    >>> runtime.reset_one(1, rng=None, index=0)[0]
    '2+2?'
    >>> runtime.run(runtime.states[1].step("<answer>4</answer>")).reward
    1.0
    >>> runtime.close()
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from rlf_envs.core.episode import EpisodeState
from rlf_envs.core.task import Task, default_user_simulator_for, split_hidden_arguments
from rlf_envs.dialogue.flags import SimChecks
from rlf_envs.dialogue.runner import DEFAULT_SIM_TIMEOUT_S, SimulatorRunner
from rlf_envs.dialogue.simulator import resolve_user_simulator
from rlf_envs.loop_thread import LoopThread
from rlf_envs.tools.parsers import ToolCallParser, get_parser
from rlf_envs.tools.toolbox import ToolBox
from rlf_envs.types import TaskInstance

T = TypeVar("T")
DEFAULT_MAX_TEXT_LENGTH = 1_000_000
StepResult = tuple[str, float, bool, bool, dict[str, Any]]  # (obs, reward, terminated, truncated, info)


@dataclass(frozen=True)
class EnvSettings:
    """The keyword arguments :class:`~rlf_envs.core.env.ToolEnv` and the vector env both take.

    Args:
        mcp_servers: the ``mcpServers`` config (dict, JSON string or path); None: the task's own.
        python_tools: extra plain functions exposed as tools.
        parser: the tool-call parser's name or object (``"hermes"``: Qwen3/Hermes ``<tool_call>``).
        max_turns: assistant turns before truncation (None: the task's).
        max_result_chars: a tool result is cut to this many characters, with a marker.
        max_calls_per_turn: more calls in one turn fail with ``too_many_calls``.
        tool_timeout_s: the per-call timeout where a server sets no ``timeout_s`` of its own.
        max_text_length: the longest observation/action the spaces hold.
        user_simulator: None (the task's default), False (none), a dict, a callable or a simulator.
        sim_checks: a :class:`SimChecks`, a dict of its fields, True/None (defaults) or False (off).
        sim_timeout_s: the time limit of one simulated user turn.
    """

    mcp_servers: dict[str, Any] | str | os.PathLike[str] | None = None
    python_tools: Sequence[Callable[..., Any]] = ()
    parser: str | ToolCallParser = "hermes"
    max_turns: int | None = None
    max_result_chars: int | None = 4000
    max_calls_per_turn: int | None = 16
    tool_timeout_s: float = 30.0
    max_text_length: int = DEFAULT_MAX_TEXT_LENGTH
    user_simulator: Any = None
    sim_checks: SimChecks | Mapping[str, Any] | bool | None = None
    sim_timeout_s: float = DEFAULT_SIM_TIMEOUT_S

    @classmethod
    def from_kwargs(cls, owner: str, kwargs: Mapping[str, Any], also: Iterable[str] = ()) -> EnvSettings:
        """The settings from an env constructor's ``**kwargs``; an unknown name is a TypeError with a hint.

        ``also`` names the owner's own keyword arguments, for the did-you-mean.

        Example:
            >>> EnvSettings.from_kwargs("ToolEnv", {"max_turns": 3}).max_turns
            3
            >>> EnvSettings.from_kwargs("ToolEnv", {"max_turn": 3})
            Traceback (most recent call last):
            TypeError: ToolEnv got an unexpected keyword argument 'max_turn' (did you mean 'max_turns'?)
        """
        known = [f.name for f in dataclasses.fields(cls)]
        for name in kwargs:
            if name not in known:
                close = difflib.get_close_matches(name, [*known, *also], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f"; it takes {sorted([*known, *also])}"
                raise TypeError(f"{owner} got an unexpected keyword argument {name!r}{hint}")
        return cls(**kwargs)

    def build_toolbox(self, task: Task) -> ToolBox:
        """The toolbox for ``task``: its default servers unless overridden, plus extra functions."""
        servers = self.mcp_servers if self.mcp_servers is not None else task.mcp_config()
        return ToolBox(
            mcp_servers=servers,
            python_tools=[*task.python_tools(), *self.python_tools],
            max_result_chars=self.max_result_chars,
            max_calls_per_turn=self.max_calls_per_turn,
            tool_timeout_s=self.tool_timeout_s,
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
        >>> from rlf_envs.core.task import FunctionTask
        >>> task = FunctionTask("t", [], lambda ep: 0.0)
        >>> build_user_simulator(task) is None, type(build_user_simulator(task, lambda r: "ok")).__name__
        (True, 'SimulatorRunner')
    """
    simulator = resolve_user_simulator(default_user_simulator_for(task) if spec is None else spec)
    if simulator is None:
        return None
    if checks is None or checks is True:
        checks = SimChecks()
    elif checks is False:
        checks = SimChecks(enabled=False)
    elif isinstance(checks, Mapping):
        checks = SimChecks(**dict(checks))
    return SimulatorRunner(simulator, checks, timeout_s=timeout_s)


def pick_instance(task: Task, split: str, index: int | None, rng: np.random.Generator | None) -> TaskInstance:
    """The instance at ``index`` of ``split`` (wrapping around), or one drawn with ``rng``."""
    instances = task.instances(split)
    if not instances:
        raise ValueError(f"task {task.name!r} has no instances in split {split!r}")
    if index is None:
        if rng is None:
            raise ValueError("pick_instance needs an index or an rng")
        index = int(rng.integers(len(instances)))
    return instances[int(index) % len(instances)]


class EnvRuntime:
    """``num_envs`` episodes of ``task`` on one event loop, sharing one toolbox and one user simulator.

    :meth:`start` (idempotent) starts the loop and the tools; :meth:`close` stops them, and a later
    :meth:`start` starts them afresh. ``split`` is the split resets draw from until changed.
    """

    def __init__(
        self, task: Task, num_envs: int, settings: EnvSettings, *, split: str = "train", name: str = ""
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.task = task
        self.num_envs = num_envs
        self.settings = settings
        self.split = split
        self.parser = get_parser(settings.parser)
        # one simulator (one HTTP client) for every episode: a step's user turns overlap on the loop
        self.simulator = build_user_simulator(
            task, settings.user_simulator, settings.sim_checks, settings.sim_timeout_s
        )
        self.loop: LoopThread | None = None
        self.states: list[EpisodeState] = []
        self._name = name or f"rlf-{task.name}"
        self._toolbox: ToolBox | None = None
        self._all_tools: list[dict[str, Any]] = []  # with the task's hidden arguments
        self._reset_info = settings.reset_info(task)

    def start(self) -> None:
        """Start the loop and the tools and make the episodes' states (once until :meth:`close`)."""
        if self.loop is not None:
            return
        loop = LoopThread(self._name)
        toolbox = self.settings.build_toolbox(self.task)
        try:
            loop.run(toolbox.start())
        except BaseException:
            loop.run(toolbox.aclose())
            loop.close()
            raise
        self.loop, self._toolbox = loop, toolbox
        self._all_tools = toolbox.openai_tools()
        self.states = [
            EpisodeState(
                self.task, toolbox, self.parser, max_turns=self.settings.max_turns,
                user_simulator=self.simulator,
            )
            for _ in range(self.num_envs)
        ]  # fmt: skip

    @property
    def toolbox(self) -> ToolBox:
        """The shared toolbox (starts the tools if needed)."""
        self.start()
        assert self._toolbox is not None
        return self._toolbox

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' schemas in OpenAI function format, without the task's hidden arguments."""
        self.start()
        return split_hidden_arguments(self._all_tools, self.task.hidden_arguments)[0]

    def reset_one(
        self, i: int, rng: np.random.Generator | None, index: int | None = None, split: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a new episode in slot ``i`` on instance ``index`` of ``split`` (default: the runtime's
        split; ``index`` None: drawn with ``rng``)."""
        self.start()
        instance = pick_instance(self.task, split or self.split, index, rng)
        obs, info = self.states[i].start(instance, self._all_tools)
        # a copy per reset: Gymnasium's checker (rightly) rejects infos that share objects across calls
        return obs, {**copy.deepcopy(self._reset_info), **info}

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop, blocking the caller (after :meth:`start`)."""
        if self.loop is None:
            coro.close()
            raise RuntimeError("step() before reset()")
        return self.loop.run(coro)

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the loop from any event loop (after :meth:`start`)."""
        if self.loop is None:
            coro.close()
            raise RuntimeError("step() before reset()")
        return await self.loop.arun(coro)

    def num_tasks(self, split: str | None = None) -> int:
        """How many task instances ``split`` (default: the current one) holds."""
        return len(self.task.instances(split or self.split))

    def messages(self, i: int) -> list[dict[str, Any]]:
        """The chat of slot ``i`` so far."""
        return [dict(m) for m in self.states[i].messages]

    def close(self) -> None:
        """End open episodes, stop the tools and the simulator's client, stop the loop. Idempotent."""
        loop = self.loop
        if loop is not None and not loop.closed:
            for state in self.states:
                state.close_episode()
            if self._toolbox is not None:
                loop.run(self._toolbox.aclose())
            if self.simulator is not None:
                loop.run(self.simulator.aclose())
            loop.close()
        self.loop, self._toolbox, self.states = None, None, []


class RuntimeView:
    """What :class:`~rlf_envs.core.env.ToolEnv` and the vector env both expose of their :class:`EnvRuntime`."""

    runtime: EnvRuntime

    @property
    def task(self) -> Task:
        return self.runtime.task

    @property
    def split(self) -> str:
        """The split resets draw from; ``reset(options={"split": ...})`` changes it."""
        return self.runtime.split

    @split.setter
    def split(self, value: str) -> None:
        self.runtime.split = value

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools' schemas in OpenAI function format (starts the tools if needed).

        Parameters the task fills in itself (:attr:`Task.hidden_arguments`) are left out.
        """
        return self.runtime.tools

    @property
    def toolbox(self) -> ToolBox:
        """The toolbox every episode shares (starts the tools if needed)."""
        return self.runtime.toolbox

    def num_tasks(self, split: str | None = None) -> int:
        """How many task instances ``split`` (default: the current one) holds, for epoch-wise sampling."""
        return self.runtime.num_tasks(split)
