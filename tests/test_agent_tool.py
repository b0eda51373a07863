"""Agents as tools: the agent MCP server (stdio and streamable HTTP) in front of OpenAI-compatible servers."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import gymnasium as gym

import rlf_envs  # noqa: F401
from rlf_envs.core.env import ToolEnv
from rlf_envs.servers.agent import agent_server_config
from rlf_envs.tasks.deepsearch.summarizer import (
    SUMMARIZE_SYSTEM_PROMPT,
    SummarizingDeepSearchTask,
    summarizer_mcp_config,
)
from tests.helpers import OpenAITestServer, free_local_port, http_server, rlf_serve

TASKS = [{"question": "What is the capital of Zorvia?", "answer": "Leidax"}]


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def tool_texts(info: dict[str, Any]) -> list[str]:
    return [m["content"] for m in info["tool_messages"]]


def test_ask_expert_over_stdio_answers_in_a_tool_use_env(openai_server: OpenAITestServer) -> None:
    expert = agent_server_config(openai_server.url, "expert-1", system_prompt="Be brief.", max_tokens=64)
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, mcp_servers={"mcpServers": {"expert": expert}})
    try:
        _, info = env.reset(seed=0)
        [tool] = info["tools"]
        assert tool["function"]["name"] == "ask_expert"
        assert tool["function"]["parameters"]["required"] == ["question"]
        obs, reward, terminated, _, info = env.step(call("ask_expert", question="Capital of Zorvia?"))
        assert info["errors"] == [] and not terminated
        assert tool_texts(info) == ["[expert-1] CAPITAL OF ZORVIA?"]
        assert "[expert-1] CAPITAL OF ZORVIA?" in obs
        _, reward, terminated, _, _ = env.step("<answer>Leidax</answer>")
        assert terminated and reward == 1.0
    finally:
        env.close()
    [body] = openai_server.bodies
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of Zorvia?"}]  # fmt: skip
    assert (body["model"], body["max_tokens"]) == ("expert-1", 64)


def test_agent_over_streamable_http(openai_server: OpenAITestServer) -> None:
    port = free_local_port()
    argv = [sys.executable, "-m", "rlf_envs.servers.agent", "--base-url", openai_server.url,
            "--model", "remote", "--name", "consult", "--arg-name", "request"]  # fmt: skip
    with http_server(argv, port):
        servers = {"mcpServers": {"remote": {"url": f"http://127.0.0.1:{port}/mcp"}}}
        env = gym.make("RLF/ToolUse-v0", tasks=TASKS, mcp_servers=servers)
        try:
            _, info = env.reset(seed=0)
            assert info["tools"][0]["function"]["parameters"]["required"] == ["request"]
            _, _, _, _, info = env.step(call("consult", request="hello"))
        finally:
            env.close()
    assert info["errors"] == [] and tool_texts(info) == ["[remote] HELLO"]


def test_8_envs_ask_at_once_and_the_calls_overlap(openai_server: OpenAITestServer) -> None:
    openai_server.delay_s = 0.5
    expert = agent_server_config(openai_server.url, "expert-1")
    envs = gym.make_vec(
        "RLF/ToolUse-v0", num_envs=8, tasks=TASKS, mcp_servers={"mcpServers": {"expert": expert}}
    )
    try:
        envs.reset(seed=0)
        _, _, _, _, infos = envs.step([call("ask_expert", question=f"q{i}") for i in range(8)])
    finally:
        envs.close()
    assert [tool_texts({"tool_messages": m}) for m in infos["tool_messages"]] == [[f"[expert-1] Q{i}"] for i in range(8)]  # fmt: skip
    assert openai_server.requests == 8 and openai_server.peak_in_flight == 8


def test_failures_of_the_model_behind_the_tool_are_clear_tool_errors(openai_server: OpenAITestServer) -> None:
    dead_url = f"http://127.0.0.1:{free_local_port()}/v1"
    servers = {
        "down": agent_server_config(dead_url, "m", name="ask_down", retries=0),
        "overloaded": agent_server_config(openai_server.url, "fail-503", name="ask_overloaded", retries=1),
        "refusing": agent_server_config(openai_server.url, "fail-401", name="ask_refusing", retries=1),
        "slow": agent_server_config(openai_server.url, "hang", name="ask_slow", timeout_s=0.5, retries=0),
        "mute": agent_server_config(openai_server.url, "empty", name="ask_mute"),
    }
    env = gym.make("RLF/ToolUse-v0", tasks=TASKS, mcp_servers={"mcpServers": servers})
    try:
        env.reset(seed=0)
        action = "".join(call(f"ask_{name}", question="q") for name in ("down", "overloaded", "refusing", "slow", "mute"))  # fmt: skip
        _, _, _, _, info = env.step(action + call("ask_mute", question="  "))
    finally:
        env.close()
    assert info["errors"] == ["tool_error"] * 6  # reported by the agent server, not an env timeout
    down, overloaded, refusing, slow, mute, blank = tool_texts(info)
    assert "ask_down failed (unavailable)" in down and "Cannot connect" in down
    assert "ask_overloaded failed (unavailable)" in overloaded and "HTTP 503" in overloaded
    assert "ask_refusing failed (bad_response)" in refusing and "HTTP 401" in refusing
    assert "ask_slow failed (unavailable)" in slow and "no reply within 0.5 s" in slow
    assert "empty_reply" in mute
    assert "'question' is empty" in blank
    assert sum(b["model"] == "fail-503" for b in openai_server.bodies) == 2  # retried once
    assert sum(b["model"] == "fail-401" for b in openai_server.bodies) == 1  # a 4xx is not retried


def test_agent_in_front_of_rlf_serve_with_the_tiny_model(shared_tiny_model_dir: Path) -> None:
    with rlf_serve(shared_tiny_model_dir) as (url, _):
        expert = agent_server_config(
            url, "tiny", max_tokens=12, system_prompt="Answer briefly.", temperature=1.0, seed=0
        )
        env = gym.make("RLF/ToolUse-v0", tasks=TASKS, mcp_servers={"mcpServers": {"expert": expert}})
        try:
            env.reset(seed=0)
            _, _, _, _, info = env.step(call("ask_expert", question="Which river rises near Steglem?"))
        finally:
            env.close()

        async def direct_reply_and_stats() -> tuple[str, dict[str, Any]]:
            messages = [{"role": "system", "content": "Answer briefly."},
                        {"role": "user", "content": "Which river rises near Steglem?"}]  # fmt: skip
            body = {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 1.0, "seed": 0}
            async with aiohttp.ClientSession() as session:
                async with session.get(url.removesuffix("/v1") + "/stats") as response:
                    stats = await response.json()
                async with session.post(f"{url}/chat/completions", json=body) as response:
                    reply = await response.json()
            return reply["choices"][0]["message"]["content"], stats

        direct, stats = asyncio.run(direct_reply_and_stats())
    # seeded sampling: the tool returned exactly what the model says to the same chat (noise, but text)
    assert stats["requests"] == 1
    assert direct.strip() and info["errors"] == [] and tool_texts(info) == [direct]


def test_summarize_next_to_search_in_deepsearch(openai_server: OpenAITestServer) -> None:
    env = gym.make("RLF/DeepSearch-v0", mcp_servers=summarizer_mcp_config(openai_server.url, "summarizer-1"))
    try:
        _, info = env.reset(seed=0)
        assert sorted(t["function"]["name"] for t in info["tools"]) == ["search", "summarize"]
        _, _, _, _, info = env.step(
            call("search", query="River") + call("summarize", text="Long text about rivers.")
        )
    finally:
        env.close()
    assert info["errors"] == []
    search, summary = tool_texts(info)
    assert search.startswith("Doc 1 (Title:")
    assert summary == "[summarizer-1] LONG TEXT ABOUT RIVERS."
    assert openai_server.bodies[0]["messages"][0] == {"role": "system", "content": SUMMARIZE_SYSTEM_PROMPT}


def test_summarizing_task_variant_declares_both_tools(openai_server: OpenAITestServer) -> None:
    task = SummarizingDeepSearchTask(
        summarizer_url=openai_server.url, summarizer_model="summarizer-1", world_seed=0
    )
    env = ToolEnv(task, split="test")
    try:
        _, info = env.reset(seed=0)
        assert "`summarize`" in info["messages"][0]["content"]
        assert sorted(t["function"]["name"] for t in info["tools"]) == ["search", "summarize"]
        _, _, _, _, info = env.step(call("summarize", text="abc"))
        assert tool_texts(info) == ["[summarizer-1] ABC"]
    finally:
        env.close()
