"""MCP server with one tool, ``run_python``: run a program in a fresh, limited, sandboxed interpreter.

Every call runs in a new child process (standard library only) in a new working directory, with
CPU, memory, file, output and wall-clock limits and an audit hook that refuses network access,
processes and files outside that directory. With ``--isolation auto`` (the default) or ``bwrap``
the child also runs under bubblewrap (its own namespaces, no network, a read-only system, a private
size-limited tmpfs); ``guards`` keeps the in-process guards alone. See docs/sandbox.md for what
each mode does and does not protect against. Calls run concurrently, and a call that crashes,
hangs or floods its output ends as a normal result while the server keeps serving.

Example:
    python -m rlf_envs.tasks.python_tool.server --cpu-s 5 --memory-mb 256 --output-chars 8000 --wall-s 10
    python -m rlf_envs.tasks.python_tool.server --isolation bwrap --transport http --port 8771
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent

from rlf_envs.isolation import DEFAULT_BWRAP, ISOLATION_CHOICES
from rlf_envs.servers.launch import add_transport_args, serve_or_exit
from rlf_envs.tasks.python_tool.sandbox import (
    PythonSandbox,
    SandboxConfigError,
    SandboxInputError,
    SandboxLimits,
    SandboxStartError,
)
from rlf_envs.tasks.python_tool.sandbox.runner import DEFAULT_MAX_CONCURRENCY

RUN_PYTHON_DESCRIPTION = (
    "Run a Python 3 program and return what it printed (stdout, then stderr) and its exit code. "
    "Use print() to see results. Each call starts a fresh interpreter with only the standard library: "
    "no variables or files carry over between calls, and there is no network access. "
    "Limits: {cpu_s:g} s of CPU, {wall_s:g} s of wall-clock time, {memory_mb} MB of memory, "
    "{output_chars} characters of output."
)


def build_server(
    sandbox: PythonSandbox, *, stats_tool: bool = False, name: str = "rlf-python-sandbox"
) -> MCPServer:
    """An MCP server exposing ``run_python(code)`` over ``sandbox`` (and ``sandbox_stats`` if asked).

    The result's text is what the model reads; its structured content carries the same facts as
    fields (``exit_code``, ``outcome``, ``output_truncated``, ...). The instructions and
    ``sandbox_stats`` name the isolation mode, and carry a warning when ``auto`` fell back to guards.

    Example:
        >>> server = build_server(PythonSandbox(SandboxLimits(cpu_s=2), isolation="guards"))
        >>> server.name, server.instructions
        ('rlf-python-sandbox', 'Runs Python programs in a sandbox (isolation: guards).')
    """
    limits = sandbox.limits
    mode = sandbox.isolation.value
    instructions = f"Runs Python programs in a sandbox (isolation: {mode})."
    if sandbox.warning:  # auto fell back to guards: whoever connects must see it
        instructions += " " + sandbox.warning
    server = MCPServer(name=name, instructions=instructions, log_level="WARNING")
    description = RUN_PYTHON_DESCRIPTION.format(
        cpu_s=limits.cpu_s, wall_s=limits.wall_s, memory_mb=limits.memory_mb, output_chars=limits.output_chars
    )

    @server.tool(description=description)
    async def run_python(code: str) -> CallToolResult:
        try:
            result = await sandbox.run(code)
        except (SandboxInputError, SandboxStartError) as error:
            raise ToolError(str(error)) from error
        return CallToolResult(
            content=[TextContent(type="text", text=result.to_text())], structured_content=result.to_dict()
        )

    if stats_tool:

        @server.tool(
            description="Sandbox counters (calls, in_flight, peak_in_flight, outcomes), isolation, warning and server pid/RSS."
        )
        def sandbox_stats() -> dict[str, Any]:
            return {
                **sandbox.stats(),
                "isolation": mode,
                "warning": sandbox.warning,
                "sandbox_info": sandbox.info(),
                "pid": os.getpid(),
                "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }

    return server


def _parser() -> argparse.ArgumentParser:
    defaults = SandboxLimits()
    parser = argparse.ArgumentParser(
        prog="python -m rlf_envs.tasks.python_tool.server", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cpu-s", type=float, default=defaults.cpu_s, help="CPU seconds per call")
    parser.add_argument("--memory-mb", type=int, default=defaults.memory_mb, help="address space per call")
    parser.add_argument("--output-chars", type=int, default=defaults.output_chars, help="stdout+stderr kept per call; more kills the call")  # fmt: skip
    parser.add_argument("--wall-s", type=float, default=defaults.wall_s, help="wall-clock seconds per call")
    parser.add_argument("--file-size-mb", type=int, default=defaults.file_size_mb, help="largest file a call may write")  # fmt: skip
    parser.add_argument("--max-concurrency", type=int, default=DEFAULT_MAX_CONCURRENCY, help="calls running at once; more wait")  # fmt: skip
    parser.add_argument("--tmp-root", type=Path, default=None, help="parent of the per-call working directories")  # fmt: skip
    parser.add_argument("--allow-read", type=Path, action="append", default=[], help="extra directory programs may read (repeatable)")  # fmt: skip
    parser.add_argument("--disk-mb", type=int, default=defaults.disk_mb, help="bwrap: size of a call's private tmpfs (/tmp and its working directory)")  # fmt: skip
    parser.add_argument("--isolation", choices=ISOLATION_CHOICES, default="auto", help="bwrap (recommended for production): bubblewrap + guards; auto: bwrap when it works, else guards with a warning; guards: in-process guards only")  # fmt: skip
    parser.add_argument("--bwrap", default=DEFAULT_BWRAP, help="the bubblewrap binary (name on PATH or path)")  # fmt: skip
    parser.add_argument("--stats-tool", action="store_true", help="also expose sandbox_stats (tests, monitoring)")  # fmt: skip
    add_transport_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    def build() -> MCPServer:
        limits = SandboxLimits(
            cpu_s=args.cpu_s,
            memory_mb=args.memory_mb,
            output_chars=args.output_chars,
            wall_s=args.wall_s,
            file_size_mb=args.file_size_mb,
            disk_mb=args.disk_mb,
        )
        sandbox = PythonSandbox(
            limits,
            tmp_root=args.tmp_root,
            max_concurrency=args.max_concurrency,
            extra_read_roots=args.allow_read,
            isolation=args.isolation,
            bwrap_path=args.bwrap,
        )
        return build_server(sandbox, stats_tool=args.stats_tool)

    return serve_or_exit("python sandbox server", args, build, (SandboxConfigError, SandboxStartError))


if __name__ == "__main__":
    sys.exit(main())
