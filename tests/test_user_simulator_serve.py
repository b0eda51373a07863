"""A real simulator endpoint: rlf-serve with the tiny random Qwen3 on 127.0.0.1 plays the customer.

The tiny model writes random text, so its replies are user messages or flagged ones; what is
checked is the plumbing: every simulator call of a vector step is in flight on the server at once
(its ``/stats`` peak), every episode gets a user turn or a flag, and killing the server while a
step's requests are in flight flags those episodes and crashes nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import gymnasium as gym

import rlf_envs  # noqa: F401  (registers the ids)
from rlf_envs.dialogue import SimErrorKind
from tests.helpers import rlf_serve

KINDS = {k.value for k in SimErrorKind}


def stats(root: str) -> dict:
    async def get() -> dict:
        async with aiohttp.ClientSession() as session, session.get(f"{root}/stats") as response:
            return await response.json()

    return asyncio.run(get())


def make_envs(num_envs: int, url: str, **simulator):
    spec = {
        "base_url": url,
        "model": "tiny",
        "max_tokens": 12,
        "temperature": 1.0,
        "extra": {"seed": 0},
        **simulator,
    }
    return gym.make_vec(
        "RLF/CustomerService-v0", num_envs=num_envs, user_simulator=spec, autoreset_mode="Disabled"
    )


def test_tiny_model_simulator_turns_are_concurrent_and_never_crash(shared_tiny_model_dir):
    with rlf_serve(shared_tiny_model_dir, "--batch-wait-ms", "1000", "--max-batch", "16") as (url, _):
        root = url.removesuffix("/v1")
        envs = make_envs(8, url)
        try:
            envs.reset(options={"task_indices": list(range(8))})
            obs, rewards, terminated, truncated, infos = envs.step(["Hello! What is your email address?"] * 8)
            served = stats(root)
            assert served["peak_in_flight"] == 8, served  # all 8 user turns of the step at once
            flagged = infos.get("_sim_error", [False] * 8)
            for i in range(8):
                if flagged[i]:
                    assert infos["sim_error"][i] in KINDS and truncated[i]
                else:
                    assert obs[i] and infos["user_message"]["content"][i] == obs[i] and not truncated[i]
        finally:
            envs.close()


def test_server_killed_mid_batch_flags_the_episodes(shared_tiny_model_dir):
    # a long batch wait keeps the step's requests queued on the server until it is killed
    with rlf_serve(shared_tiny_model_dir, "--batch-wait-ms", "20000", "--max-batch", "64") as (url, process):
        root = url.removesuffix("/v1")
        envs = make_envs(4, url, retries=0, timeout_s=30.0)
        try:
            envs.reset(options={"task_indices": [0, 1, 2, 3]})
            email = envs.unwrapped.task.instances("train")[3].metadata["facts"]["email"]
            lookup = f"<tool_call>{json.dumps({'name': 'find_user_by_email', 'arguments': {'email': email}})}</tool_call>"
            result: dict = {}
            worker = threading.Thread(
                target=lambda: result.update(out=envs.step(["Hi, your email please?"] * 3 + [lookup]))
            )
            worker.start()
            deadline = time.monotonic() + 60
            while stats(root)["in_flight"] < 3:
                assert time.monotonic() < deadline, "the simulator requests never reached the server"
                time.sleep(0.05)
            process.kill()
            worker.join(timeout=60)
            assert not worker.is_alive()
            obs, rewards, terminated, truncated, infos = result["out"]
            assert truncated.tolist() == [True, True, True, False]
            assert list(infos["sim_error"][:3]) == ["endpoint_error"] * 3
            assert "user_id" in obs[3]  # the tool turn in the same step is untouched
        finally:
            envs.close()
