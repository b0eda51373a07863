"""A test MCP server with every way a tool call can go wrong: errors, hangs, crashes, bad arguments.

Tools (each name prefixed by ``--prefix`` so two instances can share one pool):
    echo(text, delay_s=0)  the text back, after an optional delay
    fail(message)          raises a ToolError carrying the message
    hang()                 sleeps forever (until cancelled)
    die()                  kills the whole server process (os._exit) after a short sleep
    pid()                  the server's process id
    even(n)                n back; the server (not the schema) rejects odd numbers
    strict(n)              n back; n < 0 gets a JSON-RPC invalid-params error (not an isError result)
    count()                how many echo calls ran
    in_flight()            how many echo/hang calls are running now

Example:
    python tests/mcp_fixtures/faulty_server.py --prefix a_ --transport http --port 8800
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import AfterValidator

from rlf_envs.servers.launch import add_transport_args, run_server


def _must_be_even(n: int) -> int:
    if n % 2:
        raise ValueError("n must be even")
    return n


def build_server(prefix: str = "") -> MCPServer:
    server = MCPServer("faulty", log_level="WARNING")
    counters = {"echo": 0, "in_flight": 0}

    async def echo(text: str, delay_s: float = 0.0) -> str:
        """Return the text, after waiting delay_s seconds."""
        counters["echo"] += 1
        counters["in_flight"] += 1
        try:
            await asyncio.sleep(delay_s)
        finally:
            counters["in_flight"] -= 1
        return text

    def fail(message: str) -> str:
        """Raise a tool error with this message."""
        raise ToolError(message)

    async def hang() -> str:
        """Never return."""
        counters["in_flight"] += 1
        try:
            await asyncio.sleep(3600)
        finally:
            counters["in_flight"] -= 1
        return "unreachable"

    async def die() -> str:
        """Kill the server process."""
        await asyncio.sleep(0.05)
        os._exit(1)

    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    def even(n: Annotated[int, AfterValidator(_must_be_even)]) -> int:
        """Return an even number (the server rejects odd ones)."""
        return n

    def strict(n: int) -> int:
        """Return n (negative n is a protocol-level invalid-params error)."""
        if n < 0:
            raise MCPError(code=INVALID_PARAMS, message="n must be >= 0")
        return n

    def count() -> int:
        """How many echo calls ran."""
        return counters["echo"]

    def in_flight() -> int:
        """How many echo/hang calls are running now."""
        return counters["in_flight"]

    for fn in (echo, fail, hang, die, pid, even, strict, count, in_flight):
        server.add_tool(fn, name=prefix + fn.__name__)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefix", default="", help="prefix of every tool name")
    add_transport_args(parser)
    args = parser.parse_args()
    run_server(build_server(args.prefix), args)


if __name__ == "__main__":
    main()
