"""MCP server of the shop: read tools and write tools over each episode's own sqlite copy.

Every tool takes a hidden ``episode`` argument that the env fills in (the model never sees it):
the token of the episode's database file ``<root>/<token>.sqlite``, which the task copied from
the template when the episode started. Calls of different episodes therefore touch different
files: 64 episodes writing at once never see each other's writes. Each call opens its own
connection in a worker thread, so calls overlap; a broken shop rule (cancel a delivered order,
an unknown email, ...) comes back as an MCP error the agent reads. ``transfer_to_human_agents``
writes nothing; the task ends the episode when it succeeds.

Example:
    python -m rlf_envs.tasks.customer_service.server --root /tmp/rlf-cs-xyz
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from rlf_envs.servers.launch import add_transport_args, run_server
from rlf_envs.tasks.customer_service.store import OPERATIONS, StoreError, connect

__all__ = ["TOOL_DESCRIPTIONS", "build_server", "episode_path"]

_TOKEN = re.compile(r"^[0-9a-f]{32}$")

TOOL_DESCRIPTIONS = {
    "find_user_by_email": "Find a customer's user id from their email address (how you authenticate them).",
    "get_user": "Show a user's details (name, email, address) and the ids of their orders.",
    "get_order": "Show an order: its status, shipping address, items and total.",
    "cancel_order": "Cancel a pending order. reason must be 'no longer needed' or 'ordered by mistake'.",
    "change_address": "Change the shipping address of a pending order.",
    "refund_order": "Refund a delivered order in full (its status becomes 'refunded').",
    "transfer_to_human_agents": "Hand the conversation to a human agent, with a short summary. Ends the chat.",
}


def episode_path(root: str | Path, token: str) -> Path:
    """The database file of episode ``token`` under ``root`` (tokens are 32 hex digits, no paths).

    Example:
        >>> episode_path("/data", "0" * 32).name
        '00000000000000000000000000000000.sqlite'
    """
    if not isinstance(token, str) or not _TOKEN.match(token):
        raise StoreError("invalid episode token")
    return Path(root) / f"{token}.sqlite"


def run_operation(root: Path, episode: str, name: str, **arguments: Any) -> str:
    """One tool call: open the episode's database, run the operation, return its result as JSON."""
    conn = connect(episode_path(root, episode))
    try:
        return json.dumps(OPERATIONS[name](conn, **arguments), ensure_ascii=False)
    finally:
        conn.close()


def build_server(root: str | Path, *, name: str = "rlf-shop") -> MCPServer:
    """The shop's MCP server over the episode databases in ``root``."""
    server = MCPServer(name=name, instructions="Customer-service tools of a small online shop.")
    root = Path(root)

    async def call(episode: str, operation: str, **arguments: Any) -> str:
        try:
            return await anyio.to_thread.run_sync(
                lambda: run_operation(root, episode, operation, **arguments)
            )
        except StoreError as error:
            raise ToolError(str(error)) from None

    @server.tool(description=TOOL_DESCRIPTIONS["find_user_by_email"])
    async def find_user_by_email(episode: str, email: str) -> str:
        return await call(episode, "find_user_by_email", email=email)

    @server.tool(description=TOOL_DESCRIPTIONS["get_user"])
    async def get_user(episode: str, user_id: str) -> str:
        return await call(episode, "get_user", user_id=user_id)

    @server.tool(description=TOOL_DESCRIPTIONS["get_order"])
    async def get_order(episode: str, order_id: str) -> str:
        return await call(episode, "get_order", order_id=order_id)

    @server.tool(description=TOOL_DESCRIPTIONS["cancel_order"])
    async def cancel_order(episode: str, order_id: str, reason: str) -> str:
        return await call(episode, "cancel_order", order_id=order_id, reason=reason)

    @server.tool(description=TOOL_DESCRIPTIONS["change_address"])
    async def change_address(episode: str, order_id: str, address: str) -> str:
        return await call(episode, "change_address", order_id=order_id, address=address)

    @server.tool(description=TOOL_DESCRIPTIONS["refund_order"])
    async def refund_order(episode: str, order_id: str) -> str:
        return await call(episode, "refund_order", order_id=order_id)

    @server.tool(description=TOOL_DESCRIPTIONS["transfer_to_human_agents"])
    async def transfer_to_human_agents(episode: str, summary: str) -> str:
        try:
            exists = episode_path(root, episode).is_file()
        except StoreError as error:
            raise ToolError(str(error)) from None
        if not exists:
            raise ToolError("this episode's database does not exist (the episode is over)")
        return "Transferred to a human agent. The conversation is over."

    return server


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlf_envs.tasks.customer_service.server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--root", type=Path, required=True, help="the folder of the episode databases")
    add_transport_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.root.is_dir():
        print(f"shop server: no folder {args.root}", file=sys.stderr)
        return 2
    run_server(build_server(args.root), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
