"""``RLFTest/FaultyToolUse-v0``: RLF/ToolUse-v0 whose vector env fails on one rank, for the fault tests.

Importing this module registers the id; the trainer reaches it as
``env.id=tests.dist_scripts.faulty_env:RLFTest/FaultyToolUse-v0`` (Gymnasium imports the module).
Extra kwargs: ``fail_rank`` (the rank that fails, by ``RANK``), ``fail_at_step`` (the n-th
``envs.step`` call of that process, 1-based), ``fail_mode``: ``raise`` (the env raises, as a buggy
user env does), ``kill`` (the process SIGKILLs itself) or ``kill_tool_servers`` (its MCP
server processes are SIGKILLed, then the step runs). ``fault_file``: where the fault's wall-clock
time is written just before it happens (the test measures the time to exit from it).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

import rlf_envs  # noqa: F401  (registers RLF/ToolUse-v0)


class FaultyVectorEnv(gym.vector.VectorWrapper):
    """Forwards to the wrapped vector env; the ``fail_at_step``-th ``step`` on ``fail_rank`` fails."""

    def __init__(
        self, env: Any, *, fail_rank: int, fail_at_step: int, fail_mode: str, fault_file: str
    ) -> None:
        super().__init__(env)
        self.fail_here = int(os.environ.get("RANK", "0")) == fail_rank
        self.fail_at_step, self.fail_mode, self.fault_file = fail_at_step, fail_mode, Path(fault_file)
        self.steps = 0

    def __getattr__(self, name: str) -> Any:  # num_tasks and the other extensions of the RLF vector env
        return getattr(self.env, name)

    def step(self, actions: Any) -> Any:
        self.steps += 1
        if self.fail_here and self.steps == self.fail_at_step:
            self.fault_file.write_text(repr(time.time()))
            if self.fail_mode == "raise":
                raise RuntimeError(f"injected env failure on rank {os.environ.get('RANK')}")
            if self.fail_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fail_mode == "kill_tool_servers":
                _kill_tool_servers()
        return self.env.step(actions)


def _kill_tool_servers() -> None:
    import psutil

    for child in psutil.Process().children(recursive=True):
        if "rlf_envs.servers.latency" in " ".join(child.cmdline()):
            child.kill()


def make_faulty_vec(
    num_envs: int = 1,
    *,
    fail_rank: int = 1,
    fail_at_step: int = 1,
    fail_mode: str = "raise",
    fault_file: str = "fault.txt",
    **kwargs: Any,
) -> FaultyVectorEnv:
    inner = gym.make_vec("RLF/ToolUse-v0", num_envs=num_envs, **kwargs)
    return FaultyVectorEnv(
        inner, fail_rank=fail_rank, fail_at_step=fail_at_step, fail_mode=fail_mode, fault_file=fault_file
    )


gym.register("RLFTest/FaultyToolUse-v0", entry_point=None, vector_entry_point=make_faulty_vec)
