"""ToolVectorEnv: N tool-use episodes on one asyncio loop, every tool call of a step in flight at once.

A native ``gymnasium.vector.VectorEnv`` (not N envs behind a sync wrapper): one
:class:`~rlf_envs.tools.toolbox.ToolBox` (one MCP client pool, its sessions open across steps) serves
every sub-env, and ``step`` gathers all sub-envs' turns, so tool calls of all envs overlap and the
rewards of all episodes that end in this step are computed concurrently too.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=4)                # doctest: +SKIP
    >>> prompts, infos = envs.reset(seed=0)                                 # doctest: +SKIP
    >>> obs, rewards, terminated, truncated, infos = envs.step(["<answer>x</answer>"] * 4)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlf_envs.dialogue.flags import SimChecks
from rlf_envs.dialogue.runner import DEFAULT_SIM_TIMEOUT_S
from rlf_envs.env import DEFAULT_MAX_TEXT_LENGTH, ToolSettings, build_user_simulator, pick_instance
from rlf_envs.episode import EpisodeState, StepOutcome
from rlf_envs.runtime import LoopThread
from rlf_envs.spaces import UnicodeText
from rlf_envs.task import Task, split_hidden_arguments
from rlf_envs.tools.parsers import ToolCallParser, get_parser
from rlf_envs.tools.toolbox import ToolBox

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


def _autoreset_mode(mode: AutoresetMode | str) -> AutoresetMode:
    if isinstance(mode, AutoresetMode):
        return mode
    for member in AutoresetMode:
        if mode in (member.value, member.name, member.name.lower()):
            return member
    raise ValueError(f"unknown autoreset_mode {mode!r}; use one of {[m.value for m in AutoresetMode]}")


class ToolVectorEnv(VectorEnv):
    """``num_envs`` episodes of ``task`` sharing one loop and one toolbox. See docs/env_contract.md."""

    def __init__(
        self,
        task: Task,
        num_envs: int,
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
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        user_simulator: Any = None,
        sim_checks: SimChecks | Mapping[str, Any] | bool | None = None,
        sim_timeout_s: float = DEFAULT_SIM_TIMEOUT_S,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.task = task
        self.num_envs = num_envs
        self.split = split
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        self.single_observation_space = UnicodeText(max_text_length)
        self.single_action_space = UnicodeText(max_text_length)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

        self._loop = LoopThread(f"rlf-vec-{task.name}")
        settings = ToolSettings(
            mcp_servers, python_tools, max_result_chars, max_calls_per_turn, tool_timeout_s
        )
        self.toolbox: ToolBox = settings.build(task)
        self._reset_info = settings.reset_info(task)
        try:
            self._loop.run(self.toolbox.start())
        except BaseException:
            self._loop.run(self.toolbox.aclose())
            self._loop.close()
            raise
        self._all_tools = self.toolbox.openai_tools()  # with the task's hidden arguments
        self.tools: list[dict[str, Any]] = split_hidden_arguments(self._all_tools, task.hidden_arguments)[0]
        parser_obj = get_parser(parser)
        # one simulator (one HTTP client) for every sub-env: a step's user turns overlap on this loop
        self._user_simulator = build_user_simulator(task, user_simulator, sim_checks, sim_timeout_s)
        self._states = [
            EpisodeState(
                task, self.toolbox, parser_obj, max_turns=max_turns, user_simulator=self._user_simulator
            )
            for _ in range(num_envs)
        ]
        self._needs_reset = np.ones(num_envs, dtype=bool)
        self._last: list[StepResult | None] = [None] * num_envs

    # ------------------------------------------------------------------ reset
    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``). See the module docs for options."""
        if isinstance(seed, Sequence):
            seed = seed[0] if seed else None
        super().reset(seed=seed)
        options = dict(options or {})
        self.split = options.get("split", self.split)
        indices = options.get("task_indices")
        if indices is not None and len(indices) != self.num_envs:
            raise ValueError(f"options['task_indices'] needs {self.num_envs} entries, got {len(indices)}")
        mask = np.asarray(options.get("reset_mask", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        infos: dict[str, Any] = {}
        obs = [self._last_obs(i) for i in range(self.num_envs)]
        for i in np.flatnonzero(mask):
            index = None if indices is None else indices[i]
            obs[i], info = self._reset_one(int(i), index)
            infos = self._add_info(infos, info, int(i))
        return tuple(obs), infos

    def _reset_one(self, i: int, index: int | None = None) -> tuple[str, dict[str, Any]]:
        instance = pick_instance(self.task, self.split, index, self.np_random)
        obs, info = self._states[i].start(instance, self._all_tools)
        info = {**self._reset_info, **info}
        self._needs_reset[i] = False
        self._last[i] = (obs, 0.0, False, False, info)
        return obs, info

    def _last_obs(self, i: int) -> str:
        last = self._last[i]
        return last[0] if last is not None else ""

    # ------------------------------------------------------------------- step
    def step(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action; all tool calls and rewards of the batch run concurrently."""
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        results = self._loop.run(self._step_all(list(actions)))
        obs, rewards, terminated, truncated = (
            [],
            np.zeros(self.num_envs),
            np.zeros(self.num_envs, bool),
            np.zeros(self.num_envs, bool),
        )
        infos: dict[str, Any] = {}
        for i, (o, r, term, trunc, info) in enumerate(results):
            obs.append(o)
            rewards[i], terminated[i], truncated[i] = r, term, trunc
            infos = self._add_info(infos, info, i)
        return tuple(obs), rewards, terminated, truncated, infos

    async def _step_all(self, actions: list[str]) -> list[StepResult]:
        return list(await asyncio.gather(*(self._step_one(i, a) for i, a in enumerate(actions))))

    async def _step_one(self, i: int, action: str) -> StepResult:
        state = self._states[i]
        if self.autoreset_mode is AutoresetMode.NEXT_STEP and self._needs_reset[i]:
            obs, info = self._reset_one(i)
            return obs, 0.0, False, False, info
        if state.done or state.instance is None:
            if state.instance is None:
                raise RuntimeError("step() before reset()")
            # Disabled autoreset: a finished env stays finished until reset().
            return "", 0.0, state.last_terminated, state.last_truncated, {"inactive": True}
        outcome: StepOutcome = await state.step(action)
        result: StepResult = (
            outcome.obs,
            outcome.reward,
            outcome.terminated,
            outcome.truncated,
            outcome.info,
        )
        if outcome.terminated or outcome.truncated:
            if self.autoreset_mode is AutoresetMode.NEXT_STEP:
                self._needs_reset[i] = True
            elif self.autoreset_mode is AutoresetMode.SAME_STEP:
                final_obs, final_info = outcome.obs, outcome.info
                obs, info = self._reset_one(i)
                info = {**info, "final_obs": final_obs, "final_info": final_info}
                result = (obs, outcome.reward, outcome.terminated, outcome.truncated, info)
        self._last[i] = result
        return result

    # -------------------------------------------------------------- async API
    async def areset_one(
        self, i: int, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset env ``i`` alone (``options["task_index"]`` picks the instance)."""
        if seed is not None:
            self._np_random = np.random.default_rng(seed)
        options = options or {}
        return self._reset_one(i, options.get("task_index"))

    async def astep_one(self, i: int, action: str) -> StepResult:
        """Step env ``i`` as soon as its action is ready, from any event loop; no batch barrier."""
        if not 0 <= i < self.num_envs:
            raise IndexError(f"env index {i} out of range for {self.num_envs} envs")
        return await self._loop.arun(self._step_one(i, action))

    def num_tasks(self, split: str | None = None) -> int:
        """How many task instances ``split`` (default: the current one) holds, for epoch-wise sampling."""
        return len(self.task.instances(split or self.split))

    def messages(self, i: int) -> list[dict[str, Any]]:
        """The chat of env ``i`` so far."""
        return [dict(m) for m in self._states[i].messages]

    def close_extras(self, **kwargs: Any) -> None:
        if not self._loop.closed:
            for state in self._states:
                state.close_episode()
            self._loop.run(self.toolbox.aclose())
            if self._user_simulator is not None:
                self._loop.run(self._user_simulator.aclose())
            self._loop.close()
