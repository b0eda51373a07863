"""The env's background event loop (rlf_envs.loop_thread.LoopThread): closing it from anywhere."""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_envs.loop_thread import LoopThread
from tests.helpers import latency_server


def test_close_from_a_thread_running_its_own_loop_cancels_pending_work():
    # a notebook, an async app or Playwright's sync API runs a loop in the closing thread
    loop_thread = LoopThread()
    cleaned_up = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned_up.append(True)

    asyncio.run_coroutine_threadsafe(forever(), loop_thread.loop)
    assert loop_thread.run(asyncio.sleep(0, result="running")) == "running"

    async def close_here() -> None:
        loop_thread.close()
        loop_thread.close()  # idempotent

    asyncio.run(close_here())
    assert cleaned_up == [True] and loop_thread.closed


def test_close_from_its_own_loop_says_so():
    loop_thread = LoopThread()

    async def close_inside() -> None:
        loop_thread.close()

    with pytest.raises(RuntimeError, match="from its own loop"):
        loop_thread.run(close_inside())
    loop_thread.close()
    assert loop_thread.closed


def test_an_env_over_a_real_server_closes_inside_a_running_loop():
    env = gym.make(
        "RLF/ToolUse-v0",
        mcp_servers={"mcpServers": {"latency": latency_server()}},
        tasks=[{"id": "a", "question": "Echo a.", "answer": "a"}],
        reward="exact_match",
    )
    _, info = env.reset(seed=0)
    assert info["tools"], "the server's tools reached the env"
    env_loop = env.unwrapped.runtime.loop

    async def close_here() -> None:
        env.close()

    asyncio.run(close_here())
    assert env_loop.closed
