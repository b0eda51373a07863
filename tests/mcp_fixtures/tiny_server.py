"""A minimal MCP server over stdio written against the wire protocol, without the MCP SDK.

It starts in milliseconds (no SDK import), which keeps tests that only need *a* server cheap, and
it checks that the pool works with servers that are not built on our SDK.

Tools: ``{prefix}echo(text)``, ``{prefix}pid()``, ``{prefix}count()`` (echo calls so far) and
``{prefix}fail(message)`` (an isError result carrying the message).
``--start-once FILE``: the first start creates FILE; any later start (a restart) exits with an
explanation on stderr, like a server whose index went missing.

Example:
    python tests/mcp_fixtures/tiny_server.py --prefix a_
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ECHO_CALLS = [0]


def tool(name: str, description: str, **properties: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in properties.items()}}
    return {"name": name, "description": description, "inputSchema": {**schema, "required": list(properties)}}


def tool_list(prefix: str) -> list[dict[str, Any]]:
    return [
        tool(prefix + "echo", "Return the text.", text="string"),
        tool(prefix + "pid", "The server's process id."),
        tool(prefix + "count", "How many echo calls ran."),
        tool(prefix + "fail", "Report an error.", message="string"),
    ]


def text_result(text: str, is_error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def call_tool(name: str, arguments: dict[str, Any], prefix: str) -> dict[str, Any]:
    if name == prefix + "echo":
        ECHO_CALLS[0] += 1
        return text_result(str(arguments.get("text")))
    if name == prefix + "pid":
        return text_result(str(os.getpid()))
    if name == prefix + "count":
        return text_result(str(ECHO_CALLS[0]))
    if name == prefix + "fail":
        return text_result(str(arguments.get("message")), is_error=True)
    return text_result(f"Unknown tool: {name}", is_error=True)


def answer(request: dict[str, Any], prefix: str) -> dict[str, Any]:
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "tiny", "version": "0"},
        }
    if method == "ping":
        return {}
    if method == "tools/list":
        return {"tools": tool_list(prefix)}
    if method == "tools/call":
        return call_tool(params.get("name"), params.get("arguments") or {}, prefix)
    raise LookupError(method)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefix", default="")
    parser.add_argument("--start-once", type=Path)
    args = parser.parse_args()
    if args.start_once is not None:
        if args.start_once.exists():
            sys.exit(f"refusing to restart: {args.start_once} exists")
        args.start_once.touch()
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        try:
            reply = {"jsonrpc": "2.0", "id": request["id"], "result": answer(request, args.prefix)}
        except LookupError:
            error = {"code": -32601, "message": f"Method not found: {request.get('method')}"}
            reply = {"jsonrpc": "2.0", "id": request["id"], "error": error}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
