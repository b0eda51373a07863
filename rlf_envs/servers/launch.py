"""How the MCP servers we ship are launched: one set of flags for stdio and HTTP, and stdio entries.

Every server (the generic ones here and each task's own) parses :func:`add_transport_args` flags
and calls :func:`run_server`; a task's ``mcp_config()`` starts its server with
:func:`stdio_server_entry`. From a shell::

    python -m rlf_envs.servers.latency --transport http --port 8765 --latency-ms 100

Example:
    >>> entry = stdio_server_entry("rlf_envs.servers.latency", ["--latency-ms", "5"], timeout_s=10)
    >>> entry["args"], entry["timeout_s"]
    (['-m', 'rlf_envs.servers.latency', '--latency-ms', '5'], 10)
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer


def add_transport_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--transport {stdio,http} --host --port --log-level`` to a server's argument parser."""
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--log-level", default="WARNING", help="server log level; INFO logs every call")


def run_server(server: MCPServer, args: argparse.Namespace) -> None:
    """Serve ``server`` over the transport chosen by :func:`add_transport_args` flags."""
    level = getattr(logging, str(args.log_level).upper(), logging.WARNING)
    logging.basicConfig(level=level)
    for name in ("mcp", "uvicorn", "uvicorn.access", "uvicorn.error", "httpx"):
        logging.getLogger(name).setLevel(level)
    server.settings.log_level = str(args.log_level).upper()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port)


def serve_or_exit(
    name: str,
    args: argparse.Namespace,
    build: Callable[[], MCPServer],
    errors: tuple[type[BaseException], ...],
) -> int:
    """A server's ``main``: build it (one of ``errors`` becomes ``name: message`` and exit 2), then serve.

    Example:
        >>> serve_or_exit("demo", argparse.Namespace(), lambda: int("x"), (ValueError,))
        2
    """
    try:
        server = build()
    except errors as error:
        print(f"{name}: {error}", file=sys.stderr)
        return 2
    run_server(server, args)
    return 0


# The folder that holds the rlf_envs package: servers run as `python -m`, so a checkout that is not
# pip-installed still works when this folder is on their PYTHONPATH.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def stdio_server_entry(module: str, args: Sequence[str] = (), **options: Any) -> dict[str, Any]:
    """An ``mcpServers`` entry that runs ``python -m module *args`` over stdio with this interpreter.

    ``options`` are further entry keys (``timeout_s``, ``cache``, ``env`` entries to add, ...).
    """
    env = {"PYTHONPATH": PACKAGE_ROOT, **options.pop("env", {})}
    return {"command": sys.executable, "args": ["-m", module, *args], "env": env, **options}
