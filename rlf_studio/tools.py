"""The Tools tab's backend: validate ``mcpServers`` JSON, the bundled servers, a live tool session.

Validation is the env's own loader (:func:`rlf_envs.tools.mcp_config.load_mcp_config`), and a
session starts the servers through the env's own pool (:class:`rlf_envs.tools.mcp_pool.MCPToolPool`)
on an env loop thread, so what works here works in training.

Example:
    >>> check_mcp_json('{"mcpServers": {"a": {"command": "python"}}}')[1]
    '1 server(s): a (stdio)'
    >>> check_mcp_json('{"mcpServers": {"a": {"args": []}}}')[1]
    'Invalid MCP config: server \\'a\\': needs "command" (stdio) or "url" (streamable HTTP)'
    >>> add_bundled('{}', "latency")[0]["mcpServers"]["latency"]["args"][:2]
    ['-m', 'rlf_envs.servers.latency']
    >>> missing_commands({"mcpServers": {"git": {"command": "/no/such/mcp-server-git"}}})
    ["server 'git': the command '/no/such/mcp-server-git' does not exist"]
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlf_envs.loop_thread import LoopThread
from rlf_envs.servers.launch import stdio_server_entry
from rlf_envs.tools.mcp_config import MCPConfigError, MCPServerConfig, load_mcp_config
from rlf_envs.tools.mcp_pool import MCPServerStartError, MCPToolPool
from rlf_envs.types import ToolCall, ToolResult, ToolSpec

# One click adds these (module, args, extra entry keys); they run with this interpreter.
BUNDLED_SERVERS: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "latency": ("rlf_envs.servers.latency", ["--latency-ms", "5"], {"timeout_s": 10}),
    "search": ("rlf_envs.tasks.deepsearch.server", ["--world-seed", "0"], {"timeout_s": 30}),
    "sqlite": ("rlf_envs.tasks.sql.server", ["--seed", "0"], {"timeout_s": 15}),
    "python": ("rlf_envs.tasks.python_tool.server", [], {"timeout_s": 60}),
}


def parse_json_object(text: str, what: str = "JSON") -> dict[str, Any]:
    """``text`` as a JSON object, or ValueError with the line and column of the problem.

    Example:
        >>> parse_json_object('{"a": 1,}')
        Traceback (most recent call last):
        ...
        ValueError: Invalid JSON: Expecting property name enclosed in double quotes (line 1, column 9)
    """
    try:
        data = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise ValueError(f"Invalid {what}: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"Invalid {what}: expected an object {{...}}, got {type(data).__name__}")
    return data


def check_mcp_json(text: str) -> tuple[dict[str, Any] | None, str]:
    """(the config as a dict with the ``mcpServers`` key, a message) or (None, the error message)."""
    try:
        data = parse_json_object(text, "JSON")
        servers = load_mcp_config(data)
    except (ValueError, MCPConfigError) as exc:
        message = str(exc)
        return None, message if message.startswith("Invalid") else f"Invalid MCP config: {message}"
    config = data if "mcpServers" in data else {"mcpServers": data}
    names = ", ".join(f"{s.name} ({s.transport})" for s in servers) or "none"
    return config, f"{len(servers)} server(s): {names}"


def _command_problem(server: MCPServerConfig) -> str | None:
    """Why ``server``'s stdio command cannot start (None when it can be found, or for an HTTP server).

    Resolved as the pool's subprocess resolves it: a command with a '/' relative to the entry's
    ``cwd``, a bare name on the ``PATH`` of the environment the server gets (the studio's, then ``env``).
    """
    command = server.command
    if command is None:
        return None
    if "/" in command:
        path = Path(server.cwd or ".") / command
        if path.is_file() and os.access(path, os.X_OK):
            return None
        what = "is not executable" if path.is_file() else "does not exist"
        return f"server {server.name!r}: the command {command!r} {what}"
    search_path = {**os.environ, **server.env}.get("PATH", os.defpath)
    if shutil.which(command, path=search_path):
        return None
    return (
        f"server {server.name!r}: the command {command!r} is not on PATH (install it, or give its full path)"
    )


def missing_commands(config: dict[str, Any]) -> list[str]:
    """One message per stdio server whose command cannot be found: Connect would fail on it.

    ``config`` is a valid config (:func:`check_mcp_json`); disabled servers are not checked.
    """
    problems = (_command_problem(server) for server in load_mcp_config(config))
    return [problem for problem in problems if problem]


def add_bundled(text: str, name: str) -> tuple[dict[str, Any], str]:
    """The config in ``text`` plus the bundled server ``name`` (replacing one of that name)."""
    if name not in BUNDLED_SERVERS:
        raise ValueError(f"unknown bundled server {name!r}; bundled: {', '.join(BUNDLED_SERVERS)}")
    data = parse_json_object(text, "JSON")
    config = data if "mcpServers" in data else {"mcpServers": data}
    module, args, options = BUNDLED_SERVERS[name]
    config["mcpServers"][name] = stdio_server_entry(module, args, **options)
    return config, f"added the bundled {name!r} server"


@dataclass(frozen=True)
class CallOutcome:
    """One playground call: what the tool returned and how long it took."""

    ok: bool
    text: str
    error_kind: str | None
    latency_ms: float

    def markdown(self) -> str:
        status = "ok" if self.ok else f"error: `{self.error_kind}`"
        return f"**{status}** in {self.latency_ms:.1f} ms"


class ToolSession:
    """Servers started through the env's pool, kept up until :meth:`close` (one per project)."""

    def __init__(self, config: dict[str, Any], *, start_timeout_s: float = 90.0) -> None:
        self._loop = LoopThread("rlf-studio-tools")
        self._pool = MCPToolPool(config)
        try:
            self._loop.run(self._pool.start(), timeout=start_timeout_s)
        except BaseException:
            self.close()
            raise

    def specs(self) -> list[ToolSpec]:
        return self._pool.specs()

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float = 120.0) -> CallOutcome:
        started = time.perf_counter()
        result: ToolResult = self._loop.run(self._pool.call(ToolCall(name, arguments)), timeout=timeout_s)
        latency = result.latency_s or (time.perf_counter() - started)
        kind = result.error_kind.value if result.error_kind else None
        return CallOutcome(result.ok, result.text, kind, latency * 1000)

    def close(self) -> None:
        if not self._loop.closed:
            try:
                self._loop.run(self._pool.aclose(), timeout=30)
            finally:
                self._loop.close()


def connect(config: dict[str, Any]) -> tuple[ToolSession | None, str]:
    """A started session and a message, or (None, why the servers did not start)."""
    try:
        return ToolSession(config), "connected"
    except MCPServerStartError as exc:
        reasons = "; ".join(f"{name}: {reason}" for name, reason in exc.failures.items())
        return None, f"Server failed to start: {reasons}"
    except MCPConfigError as exc:
        return None, f"Invalid MCP config: {exc}"
    except TimeoutError:
        return None, "Server failed to start: no answer within the start timeout"


def tools_table(specs: list[ToolSpec]) -> list[list[str]]:
    """Rows (name, description, parameters JSON) for the tools list.

    Example:
        >>> tools_table([ToolSpec("sleep", "Wait.", {"type": "object"})])
        [['sleep', 'Wait.', '{"type": "object"}']]
    """
    return [[s.name, s.description, json.dumps(s.parameters)] for s in specs]


def example_arguments(spec: ToolSpec) -> str:
    """A JSON arguments skeleton from the tool's schema (defaults, else typed placeholders).

    Example:
        >>> example_arguments(ToolSpec("t", "", {"properties": {"q": {"type": "string"}, "k": {"default": 3}}}))
        '{"q": "", "k": 3}'
    """
    placeholders = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    args = {}
    for key, prop in (spec.parameters.get("properties") or {}).items():
        if "default" in prop:
            args[key] = prop["default"]
        else:
            kind = prop.get("type")
            args[key] = placeholders.get(kind if isinstance(kind, str) else "string", "")
    return json.dumps(args)
