"""Command-line runner shared by the MCP servers we ship: one set of flags for stdio and HTTP.

Example:
    python -m rlf_envs.servers.latency --transport http --port 8765 --latency-ms 100
"""

from __future__ import annotations

import argparse
import logging

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
