"""ToolEnv: one multi-turn tool-use episode at a time behind Gymnasium's ``Env`` API.

A view of an :class:`~rlf_envs.core.env_runtime.EnvRuntime` with one episode: the keyword arguments
(:class:`~rlf_envs.core.env_runtime.EnvSettings`), the tools' start and close and ``num_tasks`` are
the runtime's, shared with the vector env. See docs/env_contract.md.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> env = gym.make("RLF/DeepSearch-v0")                     # doctest: +SKIP
    >>> obs, info = env.reset(seed=0)                           # doctest: +SKIP
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     '<tool_call>{"name": "search", "arguments": {"query": "Velmora"}}</tool_call>')  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rlf_envs.core.env_runtime import EnvRuntime, EnvSettings, RuntimeView, StepResult
from rlf_envs.core.episode import StepOutcome
from rlf_envs.core.task import Task
from rlf_envs.spaces import UnicodeText


class ToolEnv(RuntimeView, gym.Env[str, str]):
    """A text env: observations are prompts / tool results, actions are assistant turns.

    ``ToolEnv(task, *, split="train", render_mode=None, **settings)``: ``settings`` are the fields
    of :class:`~rlf_envs.core.env_runtime.EnvSettings` (``mcp_servers``, ``max_turns``, ``parser``, ...).
    Tools start lazily on the first ``reset`` and live until ``close``.
    """

    metadata = {"render_modes": ["ansi"]}

    def __init__(
        self, task: Task, *, split: str = "train", render_mode: str | None = None, **settings: Any
    ) -> None:
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        env_settings = EnvSettings.from_kwargs("ToolEnv", settings, also=("split", "render_mode"))
        self.runtime = EnvRuntime(task, 1, env_settings, split=split, name=f"rlf-{task.name}")
        self.render_mode = render_mode
        self.observation_space = UnicodeText(env_settings.max_text_length)
        self.action_space = UnicodeText(env_settings.max_text_length)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode; ``seed`` seeds the draw of its instance (Gymnasium's ``np_random``).

        Args:
            seed: seeds the env's RNG (the instance drawn when no ``task_index`` is given).
            options: ``task_index`` (int: that instance of the split), ``split`` (kept for later resets).

        Returns:
            observation (str): the user prompt.
            info (dict): ``messages``, ``tools``, ``task_id`` (:mod:`rlf_envs.info_keys`) and the
            task's ``env_info()``.
        """
        super().reset(seed=seed)
        options = options or {}
        self.split = options.get("split", self.split)
        return self.runtime.reset_one(0, self.np_random, options.get("task_index"))

    def step(self, action: str) -> StepResult:
        """Apply one assistant turn: run its tool calls, let the user answer, or end and score the episode.

        Returns:
            observation (str): the tool results, the simulated user's reply, or "" at an answer.
            reward (float): the turn's process reward, or the task's reward on the last step.
            terminated (bool): the episode ended on its own (an answer, a user stop, a terminating tool).
            truncated (bool): it was cut (``max_turns``, a failed simulator); still scored.
            info (dict): the keys of :mod:`rlf_envs.info_keys` that apply (docs/env_contract.md).
        """
        outcome = self.runtime.run(self._state_step(action))
        return outcome.obs, outcome.reward, outcome.terminated, outcome.truncated, outcome.info

    async def astep(self, action: str) -> StepResult:
        """Async ``step`` usable from any event loop."""
        outcome = await self.runtime.arun(self._state_step(action))
        return outcome.obs, outcome.reward, outcome.terminated, outcome.truncated, outcome.info

    async def _state_step(self, action: str) -> StepOutcome:
        return await self.runtime.states[0].step(action)

    def render(self) -> str | None:
        if self.render_mode != "ansi" or not self.runtime.states:
            return None
        return render_transcript(self.runtime.states[0].messages)

    def close(self) -> None:
        self.runtime.close()
        super().close()


def render_transcript(messages: list[dict[str, Any]]) -> str:
    """A readable transcript of a chat (what ``render_mode="ansi"`` returns).

    Example:
        >>> print(render_transcript([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]))
        [user] 2+2?
        [assistant] 4
    """
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
