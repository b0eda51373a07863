"""GEM (``gem-llm``) driver: N episodes of its vector env, each step one MCP ``sleep`` call per episode.

Run with the GEM venv's python; see :mod:`rlf_bench.peer_drivers`. The workload goes through
GEM's own stack end to end: ``gem.make_vec(..., async_mode=True)`` (its thread-pool
``AsyncVectorEnv``), ``ToolEnvWrapper`` around a registered GEM env, and ``gem.tools.mcp_tool.MCPTool``
(a fastmcp client) parsing GEM's ``<tool_call><tool_name>..`` action format and calling the server.

Two tool layouts, as a GEM user would write them:

- ``shared``: one ``MCPTool`` wrapped into every env (GEM's own tests write it so). Measured here
  it hung at 8 envs: its one fastmcp client is entered from several threads' event loops at once;
- ``per_env`` (the default, the one that works): one ``MCPTool`` per env, no client shared
  between the pool's threads.

Job keys: ``server`` (an ``mcpServers`` entry: ``{"url": ...}`` or ``{"command", "args"}``),
``num_envs``, ``steps``, ``tool_layout`` ("shared" | "per_env"), ``base_env``.

Example:
    .venv-peers/gem/bin/python gem_driver.py '{"server": {"url": "http://127.0.0.1:8765/mcp"},
        "num_envs": 16, "steps": 3}'
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from importlib.metadata import version
from typing import Any


def _read_job() -> dict[str, Any]:
    raw = sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read()
    return json.loads(raw)


def _quiet_logs() -> None:
    # gem's __init__ turns on INFO logging for everything; per-call logs would cost more than the calls
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("gem", "fastmcp", "mcp", "httpx", "httpx2", "FastMCP"):
        logging.getLogger(name).setLevel(logging.WARNING)


def run(job: dict[str, Any]) -> dict[str, Any]:
    from functools import partial

    import gem
    from gem.tools.mcp_tool import MCPTool
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    _quiet_logs()
    num_envs, steps = int(job["num_envs"]), int(job["steps"])
    layout = job.get("tool_layout", "per_env")
    base_env = job.get("base_env", "game:GuessTheNumber-v0-hard")
    config = {"mcpServers": {"latency": dict(job["server"])}}
    timeout_s = float(job.get("timeout_s", 60.0))

    setup_started = time.perf_counter()
    if layout == "shared":
        shared = MCPTool(config, execution_timeout=timeout_s)
        wrapper = partial(ToolEnvWrapper, tools=[shared], max_tool_uses=steps + 10)
    elif layout == "per_env":

        def wrapper(env: Any) -> Any:
            tool = MCPTool(json.loads(json.dumps(config)), execution_timeout=timeout_s)
            return ToolEnvWrapper(env, tools=[tool], max_tool_uses=steps + 10)

    else:
        raise ValueError(f"tool_layout must be 'shared' or 'per_env', got {layout!r}")
    envs = gem.make_vec([base_env] * num_envs, wrappers=[wrapper], async_mode=True)
    envs.reset(seed=0)
    action = "<tool_call><tool_name>sleep</tool_name><arguments>{}</arguments></tool_call>"
    envs.step([action] * num_envs)  # warm-up, as in our bench: first-call costs are not timed
    setup_s = time.perf_counter() - setup_started

    errors = 0
    observations: list[str] = []
    started = time.perf_counter()
    for _ in range(steps):
        observations, _, terminated, truncated, _ = envs.step([action] * num_envs)
        errors += sum(1 for o in observations if "slept" not in str(o))
        if any(terminated) or any(truncated):
            raise RuntimeError("a GEM episode ended during the benchmark; raise max_tool_uses")
    wall = time.perf_counter() - started
    return {
        "peer": "gem",
        "version": version("gem-llm"),
        "fastmcp": version("fastmcp"),
        "tool_layout": layout,
        "num_envs": num_envs,
        "steps": steps,
        "wall_s": wall,
        "steps_per_s": num_envs * steps / wall,
        "setup_s": setup_s,
        "errors": errors,
        "sample_obs": str(observations[0])[:200] if observations else "",
    }


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
