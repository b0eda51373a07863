"""ToolVectorEnv: N tool-use episodes on one asyncio loop, every tool call of a step in flight at once.

A native ``gymnasium.vector.VectorEnv`` (not N envs behind a sync wrapper) over an
:class:`~rlf_envs.core.env_runtime.EnvRuntime` with ``num_envs`` episodes: one
:class:`~rlf_envs.tools.toolbox.ToolBox` (one MCP client pool, its sessions open across steps)
serves every sub-env, and ``step`` gathers all sub-envs' turns, so tool calls of all envs overlap
and the rewards of all episodes that end in this step are computed concurrently too. What this
class adds to the runtime is Gymnasium's vector semantics: per-env seeding, autoreset, batching.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=4)                # doctest: +SKIP
    >>> prompts, infos = envs.reset(seed=0)                                 # doctest: +SKIP
    >>> obs, rewards, terminated, truncated, infos = envs.step(["<answer>x</answer>"] * 4)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rlf_envs.core.env_runtime import EnvRuntime, EnvSettings, RuntimeView, StepResult
from rlf_envs.core.episode import StepOutcome
from rlf_envs.core.task import Task
from rlf_envs.info_keys import FINAL_INFO, FINAL_OBS, INACTIVE
from rlf_envs.spaces import UnicodeText


def _autoreset_mode(mode: AutoresetMode | str) -> AutoresetMode:
    if isinstance(mode, AutoresetMode):
        return mode
    for member in AutoresetMode:
        if mode in (member.value, member.name, member.name.lower()):
            return member
    raise ValueError(f"unknown autoreset_mode {mode!r}; use one of {[m.value for m in AutoresetMode]}")


def per_env_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None]:
    """One seed per env, as Gymnasium's vector envs take them: an int ``s`` gives ``s, s+1, ...``.

    Example:
        >>> per_env_seeds(7, 3), per_env_seeds([4, None, 2], 3), per_env_seeds(None, 2)
        ([7, 8, 9], [4, None, 2], [None, None])
        >>> per_env_seeds([1, 2], 3)
        Traceback (most recent call last):
        ValueError: reset(seed=[...]) needs one seed per env: 3 envs, got 2 seeds
    """
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, int | np.integer):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"reset(seed=[...]) needs one seed per env: {num_envs} envs, got {len(seeds)} seeds")
    return [None if s is None else int(s) for s in seeds]


class ToolVectorEnv(RuntimeView, VectorEnv):
    """``num_envs`` episodes of ``task`` sharing one loop and one toolbox. See docs/env_contract.md.

    ``ToolVectorEnv(task, num_envs, *, split="train", autoreset_mode="NextStep", **settings)``:
    ``settings`` are the fields of :class:`~rlf_envs.core.env_runtime.EnvSettings`, as for ``ToolEnv``.
    Env ``i`` draws its instances with an RNG of its own, seeded by ``reset(seed=...)`` (an int
    ``s`` seeds env i with ``s + i``, a list seeds env i with ``seed[i]``) or ``areset_one(i, seed)``.
    """

    def __init__(
        self,
        task: Task,
        num_envs: int,
        *,
        split: str = "train",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        **settings: Any,
    ) -> None:
        also = ("num_envs", "split", "autoreset_mode")
        env_settings = EnvSettings.from_kwargs("ToolVectorEnv", settings, also=also)
        self.runtime = EnvRuntime(task, num_envs, env_settings, split=split, name=f"rlf-vec-{task.name}")
        self.num_envs = num_envs
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.autoreset_mode, "render_modes": []}
        self.single_observation_space = UnicodeText(env_settings.max_text_length)
        self.single_action_space = UnicodeText(env_settings.max_text_length)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.runtime.start()
        self._rngs: list[np.random.Generator | None] = [None] * num_envs
        self._needs_reset = np.ones(num_envs, dtype=bool)
        self._last: list[StepResult | None] = [None] * num_envs

    # ------------------------------------------------------------------ reset
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset all envs (or those in ``options["reset_mask"]``); env i is seeded as the class docs say.

        Options: ``task_indices`` (one instance index per env), ``split``, ``reset_mask``.
        """
        seeds = per_env_seeds(seed, self.num_envs)
        if seed is None or isinstance(seed, int | np.integer):
            super().reset(seed=None if seed is None else int(seed))
        options = dict(options or {})
        self.split = options.get("split", self.split)
        indices = options.get("task_indices")
        if indices is not None and len(indices) != self.num_envs:
            raise ValueError(f"options['task_indices'] needs {self.num_envs} entries, got {len(indices)}")
        mask = np.asarray(options.get("reset_mask", np.ones(self.num_envs, dtype=bool)), dtype=bool)
        infos: dict[str, Any] = {}
        obs = [self._last_obs(i) for i in range(self.num_envs)]
        for i in (int(i) for i in np.flatnonzero(mask)):
            if seeds[i] is not None:
                self._rngs[i] = seeding.np_random(seeds[i])[0]
            obs[i], info = self._reset_one(i, None if indices is None else indices[i])
            infos = self._add_info(infos, info, i)
        return tuple(obs), infos

    def _rng(self, i: int) -> np.random.Generator:
        rng = self._rngs[i]
        if rng is None:  # never seeded: fresh entropy, as an unseeded Gymnasium env
            rng = self._rngs[i] = seeding.np_random()[0]
        return rng

    def _reset_one(
        self, i: int, index: int | None = None, split: str | None = None
    ) -> tuple[str, dict[str, Any]]:
        obs, info = self.runtime.reset_one(i, self._rng(i), index, split)
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
        results = self.runtime.run(self._step_all(list(actions)))
        rewards = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        infos: dict[str, Any] = {}
        for i, (_, reward, term, trunc, info) in enumerate(results):
            rewards[i], terminated[i], truncated[i] = reward, term, trunc
            infos = self._add_info(infos, info, i)
        return tuple(r[0] for r in results), rewards, terminated, truncated, infos

    async def _step_all(self, actions: list[str]) -> list[StepResult]:
        return list(await asyncio.gather(*(self._step_one(i, a) for i, a in enumerate(actions))))

    async def _step_one(self, i: int, action: str) -> StepResult:
        state = self.runtime.states[i]
        if self.autoreset_mode is AutoresetMode.NEXT_STEP and self._needs_reset[i]:
            obs, info = self._reset_one(i)
            return obs, 0.0, False, False, info
        if state.instance is None:
            raise RuntimeError("step() before reset()")
        if state.done:  # Disabled autoreset: a finished env stays finished until reset()
            return "", 0.0, state.last_terminated, state.last_truncated, {INACTIVE: True}
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
                obs, info = self._reset_one(i)
                info = {**info, FINAL_OBS: outcome.obs, FINAL_INFO: outcome.info}
                result = (obs, outcome.reward, outcome.terminated, outcome.truncated, info)
        self._last[i] = result
        return result

    # -------------------------------------------------------------- async API
    async def areset_one(
        self, i: int, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset env ``i`` alone; ``seed`` reseeds env i's RNG only, ``options["task_index"]`` picks the
        instance, of ``options["split"]`` when given (this episode only: the other envs keep theirs)."""
        self._check_index(i)
        if seed is not None:
            self._rngs[i] = seeding.np_random(seed)[0]
        options = options or {}
        return self._reset_one(i, options.get("task_index"), options.get("split"))

    async def astep_one(self, i: int, action: str) -> StepResult:
        """Step env ``i`` as soon as its action is ready, from any event loop; no batch barrier."""
        self._check_index(i)
        return await self.runtime.arun(self._step_one(i, action))

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.num_envs:
            raise IndexError(f"env index {i} out of range for {self.num_envs} envs")

    def messages(self, i: int) -> list[dict[str, Any]]:
        """The chat of env ``i`` so far."""
        return self.runtime.messages(i)

    def close_extras(self, **kwargs: Any) -> None:
        self.runtime.close()
