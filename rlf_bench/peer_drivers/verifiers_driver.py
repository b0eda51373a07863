"""verifiers (0.4.0, ``verifiers.v1``) driver: N rollouts, each turn one MCP ``sleep`` call per rollout.

Run with the verifiers venv's python; see :mod:`rlf_bench.peer_drivers`. In verifiers 0.4 a
rollout's tool calls are executed by the harness's *chat program*: ``CHAT_PROGRAM_SOURCE``, the
flat script that ``bundle_program`` splices together from ``harnesses/utils/{mcp,compaction,core}.py``
and that the Null/Bash harnesses launch once per rollout. Its ``run_chat_loop`` asks the model for a
turn, parses the turn's ``tool_calls``, runs each through ``call_mcp`` on the rollout's own
``MCPConnection`` (a ``mcp.Client`` over streamable HTTP, opened by ``connect_mcp``), and appends the
tool messages, until a turn has no tool call.

This driver loads that very program text as a module (its ``__main__`` guard keeps it inert) and runs
``run_chat_loop`` for N rollouts concurrently on one event loop, with a scripted model in place of the
OpenAI client: a ``Compactor`` subclass (compaction off, as by default) whose ``complete`` returns a
turn with one ``sleep`` tool call, ``steps`` times, then a plain answer. What it leaves out is
verifiers' per-rollout overhead around the loop (one program process per rollout, the model
request's round trip through the interception server), so its figure is an upper bound for verifiers.

verifiers' MCP client speaks streamable HTTP only (``mcp_client`` takes ``spec["url"]``).

Job keys: ``server`` (``{"url": ...}``), ``num_envs``, ``steps``, ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import types
from contextlib import AsyncExitStack
from importlib.metadata import version
from typing import Any


def _read_job() -> dict[str, Any]:
    raw = sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()
    return json.loads(raw)


def load_chat_program() -> types.ModuleType:
    """verifiers' bundled chat program (the exact text its harness runs) as an importable module."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    module = types.ModuleType("vf_chat_program")
    exec(compile(CHAT_PROGRAM_SOURCE, "<verifiers chat program>", "exec"), module.__dict__)  # noqa: S102
    return module


def _completion(turn: int, tool_name: str | None) -> Any:
    from openai.types.chat import ChatCompletion

    message: dict[str, Any] = {"role": "assistant", "content": ""}
    if tool_name is not None:
        message["tool_calls"] = [
            {"id": f"call_{turn}", "type": "function", "function": {"name": tool_name, "arguments": "{}"}}
        ]
    else:
        message["content"] = "<answer>done</answer>"
    return ChatCompletion.model_validate(
        {
            "id": f"scripted-{turn}",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_name else "stop",
                }
            ],
        }
    )


def _result(
    transcripts: list[list[dict]], num_envs: int, steps: int, wall: float, setup_s: float
) -> dict[str, Any]:
    """The driver's report from the finished transcripts (every tool result must be there)."""
    tool_messages = [m for t in transcripts for m in t if m.get("role") == "tool"]
    errors = sum(1 for m in tool_messages if "slept" not in str(m.get("content")))
    if len(tool_messages) != num_envs * steps:
        raise RuntimeError(f"expected {num_envs * steps} tool results, got {len(tool_messages)}")
    return {
        "peer": "verifiers",
        "version": version("verifiers"),
        "mcp": version("mcp"),
        "num_envs": num_envs,
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": num_envs * steps / wall,
        "setup_s": setup_s,
        "errors": errors,
        "sample_obs": str(tool_messages[0].get("content"))[:200] if tool_messages else "",
    }


def run(job: dict[str, Any]) -> dict[str, Any]:
    program = load_chat_program()
    num_envs, steps = int(job["num_envs"]), int(job["steps"])
    server = dict(job["server"])
    if "url" not in server:
        raise ValueError("verifiers' MCP client is streamable-HTTP only: the job needs server.url")
    spec = {"url": server["url"], "timeout": float(job.get("timeout_s", 60.0))}
    config = {"mcpServers": {"latency": spec}}
    args = types.SimpleNamespace(tool_interception_url="", api_key="", bash=False, edit=False, search=False)

    class ScriptedModel(program.Compactor):
        """The model side of one rollout: ``steps`` turns calling ``sleep``, then an answer."""

        def __init__(self, tool_name: str) -> None:
            super().__init__(client=None, model="scripted", tools=[], enabled=False, threshold=None)
            self.tool_name = tool_name
            self.turns = 0

        async def complete(self, messages: list[dict]) -> tuple[Any, list[dict]]:
            self.turns += 1
            name = self.tool_name if self.turns <= steps else None
            return _completion(self.turns, name), messages

    async def bench() -> dict[str, Any]:
        async with AsyncExitStack() as stack:
            setup_started = time.perf_counter()
            # one client per rollout, as each rollout's program opens its own (connect_mcp lists the tools)
            connected = await asyncio.gather(*(connect_mcp_in(stack) for _ in range(num_envs)))
            setup_s = time.perf_counter() - setup_started
            tool_name = next(name for name in connected[0][1] if name.endswith("sleep"))
            transcripts = [[{"role": "user", "content": "benchmark"}] for _ in range(num_envs)]
            started = time.perf_counter()
            await asyncio.gather(
                *(
                    program.run_chat_loop(
                        args, ScriptedModel(tool_name), transcripts[i], dispatch, servers, None
                    )
                    for i, (_, dispatch, servers) in enumerate(connected)
                )
            )
            wall = time.perf_counter() - started
        return _result(transcripts, num_envs, steps, wall, setup_s)

    async def connect_mcp_in(stack: AsyncExitStack) -> Any:
        # MCPConnection runs its client in a task it owns; closing happens through the stack's callbacks
        return await program.connect_mcp(config, stack)

    return asyncio.run(bench())


def main() -> int:
    try:
        result = run(_read_job())
    except Exception as exc:  # noqa: BLE001 - the parent prints why a peer failed instead of a number
        print(
            json.dumps({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]})
        )
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
