"""MCP servers as tools: one long-lived client pool per env process, stdio and streamable HTTP.

:class:`MCPToolPool` starts every configured server (``replicas`` processes or HTTP sessions each),
lists their tools, and turns every :class:`ToolCall` into a :class:`ToolResult` without ever
raising: unknown tools, arguments that fail the tool's input schema, tool errors, timeouts, a
server that dies mid-call or cannot be restarted all come back as results with an
:class:`ErrorKind`. Calls run concurrently (one stdio session carries hundreds of requests in
flight); a dead server is restarted in the background so the next call finds it up again.

Each replica's connection lives in its own supervisor task, which opens the transport and the
session, publishes the session, waits until the connection dies or the pool closes, and tears it
down: anyio/MCP context managers are always entered and exited by that one task. Everything runs
on the caller's asyncio loop. Connections negotiate like ``mcp.Client(mode="auto")``: the
2026-07-28 protocol where the server offers it, the initialize handshake otherwise.

Example:
    >>> import asyncio, sys
    >>> config = {"mcpServers": {"latency": {"command": sys.executable,
    ...     "args": ["-m", "rlf_envs.servers.latency", "--latency-ms", "5"]}}}
    >>> async def demo():
    ...     async with MCPToolPool(config) as pool:
    ...         result = await pool.call(ToolCall("sleep", {"payload": "hi"}))
    ...     return result.ok, result.text
    >>> asyncio.run(demo())
    (True, 'slept 5.0 ms: hi')
"""

from __future__ import annotations

import asyncio
import copy
import enum
import json
import logging
import os
import re
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager, nullcontext, suppress
from dataclasses import dataclass, replace
from typing import Any

import anyio
import httpx2
import mcp_types
import pydantic
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from rlf_envs.tools.mcp_config import MCPConfigError, MCPServerConfig, load_mcp_config
from rlf_envs.tools.types import ErrorKind, ToolCall, ToolResult, ToolSpec

__all__ = ["MCPConfigError", "MCPServerStartError", "MCPToolPool", "result_text"]

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="rlf", version="0.1.0")
PING_TIMEOUT_S = 5.0  # health check after a call saw the connection fail
RETRY_BACKOFF_S = (0.5, 30.0)  # first and largest wait between failed restart attempts
STOP_TIMEOUT_S = 15.0  # the SDK's own stdio shutdown is bounded at ~4.5 s; this is the backstop
STDERR_TAIL_LINES = 20

# MCPServer (and FastMCP before it) reports arguments that fail its own validation as an isError
# result reading "Error executing tool <name>: 1 validation error for <name>Arguments ...".
_SERVER_VALIDATION_ERROR = re.compile(r"validation errors? for \S*Arguments\b")


class MCPServerStartError(RuntimeError):
    """Servers that failed their initial start. ``failures`` maps server name to the reason."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = dict(failures)
        details = "\n".join(f"  {name}: {reason}" for name, reason in failures.items())
        super().__init__(f"{len(failures)} MCP server(s) failed to start:\n{details}")


class MCPToolPool:
    """A :class:`~rlf_envs.tools.types.ToolProvider` over the MCP servers of an ``mcpServers`` config.

    Args:
        config: the ``mcpServers`` JSON as a dict (with or without the outer key), a JSON string,
            or a path to a JSON file; see :mod:`rlf_envs.tools.mcp_config` for the keys.
        default_timeout_s: per-call timeout for servers without their own ``timeout_s``.

    Raises:
        MCPConfigError: at construction for a malformed config; from :meth:`start` when two
            servers offer a tool of the same name.

    Example:
        >>> pool = MCPToolPool({"search": {"url": "http://127.0.0.1:8765/mcp", "replicas": 2}})
        >>> pool.stats()["search"]["replicas"]
        2
    """

    def __init__(
        self, config: dict[str, Any] | str | os.PathLike[str], *, default_timeout_s: float = 30.0
    ) -> None:
        if not default_timeout_s > 0:
            raise MCPConfigError(f"default_timeout_s must be > 0, got {default_timeout_s!r}")
        self._servers = [_Server(cfg, default_timeout_s) for cfg in load_mcp_config(config)]
        self._routes: dict[str, _Server] = {}
        self._started = False
        self._closed = False

    async def start(self) -> None:
        """Start every replica of every server, initialize the sessions and list the tools.

        Raises:
            MCPServerStartError: some server could not be spawned, reached or initialized (every
                server is stopped again before this raises).
            MCPConfigError: two servers offer a tool of the same name.
        """
        if self._started:
            return
        if self._closed:
            raise RuntimeError("this MCPToolPool is closed; make a new one")
        try:
            for server in self._servers:
                server.start()
            outcomes = await asyncio.gather(*(s.wait_started() for s in self._servers))
            failures = {s.name: reason for s, reason in zip(self._servers, outcomes, strict=True) if reason}
            if failures:
                raise MCPServerStartError(failures)
            self._routes = _route_tools(self._servers)
        except BaseException:
            await self.aclose()
            raise
        self._started = True

    def specs(self) -> list[ToolSpec]:
        """The tools of every server, in config order, as OpenAI-style function schemas."""
        return [tool.spec for server in self._servers for tool in server.tools.values()]

    def has_tool(self, name: str) -> bool:
        return name in self._routes

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one tool call. Never raises, except ``CancelledError`` when the caller is cancelled."""
        started = time.perf_counter()
        server = self._routes.get(call.name)
        if server is None or not self._started:
            if self._closed or not self._started:
                state = "closed" if self._closed else "not started (call start() first)"
                return ToolResult.failure(call, ErrorKind.SERVER_UNAVAILABLE, f"the MCP tool pool is {state}")
            names = ", ".join(sorted(self._routes)) or "none"
            return ToolResult.failure(
                call, ErrorKind.UNKNOWN_TOOL, f"no tool named {call.name!r}; available: {names}"
            )
        try:
            return await server.call(call)
        except Exception as exc:  # a bug here must still cost only this call
            logger.exception("MCP call %r failed unexpectedly", call.name)
            message = f"internal error: {type(exc).__name__}: {exc}"
            return ToolResult.failure(call, ErrorKind.TOOL_ERROR, message, time.perf_counter() - started)

    async def aclose(self) -> None:
        """Stop every server and wait for the processes to exit; later calls get SERVER_UNAVAILABLE."""
        self._closed = True
        self._started = False
        await asyncio.gather(*(server.stop() for server in self._servers))

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per server: transport, replicas, calls, ok, errors by kind, cache hits, restarts, in-flight."""
        return {server.name: server.stats() for server in self._servers}

    async def __aenter__(self) -> MCPToolPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _route_tools(servers: list[_Server]) -> dict[str, _Server]:
    routes: dict[str, _Server] = {}
    for server in servers:
        for name in server.tools:
            if name in routes:
                raise MCPConfigError(
                    f"tool {name!r} is offered by both server {routes[name].name!r} and server {server.name!r}; "
                    "tool names must be unique across servers"
                )
            routes[name] = server
    return routes


@dataclass(frozen=True)
class _RemoteTool:
    """A tool as listed by its server, with a compiled validator for its input schema."""

    spec: ToolSpec
    validator: Any  # a jsonschema Validator, or None when the schema itself is invalid

    @classmethod
    def from_mcp(cls, tool: mcp_types.Tool) -> _RemoteTool:
        schema = dict(tool.input_schema or {})
        schema.setdefault("type", "object")
        description = tool.description or tool.title or tool.name
        return cls(
            ToolSpec(tool.name, description, _model_facing_schema(schema)),
            _compile_validator(tool.name, schema),
        )

    def argument_error(self, arguments: Any) -> str | None:
        """Why ``arguments`` fail the input schema, or None when they pass."""
        if not isinstance(arguments, dict):
            return f"arguments must be a JSON object, got {type(arguments).__name__}"
        if self.validator is None or self.validator.is_valid(arguments):  # the common case, cheaply
            return None
        from jsonschema.exceptions import best_match

        error = best_match(self.validator.iter_errors(arguments))
        if error is None:
            return None
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
        return (
            f"invalid arguments for {self.spec.name!r}: "
            + (f"arguments{where}: " if where else "")
            + error.message
        )


def _compile_validator(name: str, schema: dict[str, Any]) -> Any:
    from jsonschema import Draft202012Validator, SchemaError
    from jsonschema.validators import validator_for

    validator_cls = validator_for(schema, default=Draft202012Validator)
    try:
        validator_cls.check_schema(schema)
    except SchemaError as exc:
        logger.warning("tool %r has an invalid input schema (arguments go unchecked): %s", name, exc.message)
        return None
    return validator_cls(schema)


def _model_facing_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema without the auto-generated titles ("Ms", "sleepArguments"): tokens the model need not read."""
    clean = copy.deepcopy(schema)
    clean.pop("title", None)
    for prop in clean.setdefault("properties", {}).values():
        if isinstance(prop, dict):
            prop.pop("title", None)
    return clean


class _LRUCache:
    """Ok results keyed on tool name + canonical JSON arguments; the oldest entry goes first."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, ToolResult] = OrderedDict()

    @staticmethod
    def key(call: ToolCall) -> str | None:
        try:
            args = json.dumps(call.arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError):
            return None  # not JSON (a parser bug); such calls are just not cached
        return f"{call.name}\x00{args}"

    def get(self, key: str) -> ToolResult | None:
        result = self._entries.get(key)
        if result is not None:
            self._entries.move_to_end(key)
        return result

    def put(self, key: str, result: ToolResult) -> None:
        self._entries[key] = result
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class _Server:
    """One configured server: its replicas, tools, cache and counters."""

    def __init__(self, config: MCPServerConfig, default_timeout_s: float) -> None:
        self.config = config
        self.name = config.name
        self.timeout_s = config.timeout_s or default_timeout_s
        self.replicas = [_Replica(config, index, self.timeout_s) for index in range(config.replicas)]
        self.tools: dict[str, _RemoteTool] = {}
        self._cache = _LRUCache(config.cache_size) if config.cache_size else None
        self._next_replica = 0
        self._calls = 0
        self._ok = 0
        self._cache_hits = 0
        self._errors: dict[str, int] = {}

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    async def wait_started(self) -> str | None:
        """None once every replica is up (tools listed), else why the first one that failed did."""
        reasons = await asyncio.gather(*(replica.wait_started() for replica in self.replicas))
        failed = [
            f"replica {r.index}: {reason}" if len(self.replicas) > 1 else reason
            for r, reason in zip(self.replicas, reasons, strict=True)
            if reason
        ]
        if failed:
            return "; ".join(failed)
        self.tools = {tool.name: _RemoteTool.from_mcp(tool) for tool in self.replicas[0].tools}
        return None

    async def stop(self) -> None:
        await asyncio.gather(*(replica.stop() for replica in self.replicas))

    async def call(self, call: ToolCall) -> ToolResult:
        started = time.perf_counter()
        self._calls += 1
        problem = self.tools[call.name].argument_error(call.arguments)
        if problem is not None:
            return self._count(ToolResult.failure(call, ErrorKind.BAD_ARGUMENTS, problem))
        cache = self._cache
        key = _LRUCache.key(call) if cache is not None else None
        if cache is not None and key is not None and (hit := cache.get(key)) is not None:
            self._cache_hits += 1
            return self._count(replace(hit, call=call, cached=True, latency_s=time.perf_counter() - started))
        result = await self._least_loaded_replica().call(call)
        if cache is not None and key is not None and result.ok:
            cache.put(key, result)
        return self._count(result)

    def _least_loaded_replica(self) -> _Replica:
        # Prefer replicas that are up; rotate the start so equal loads still spread the calls.
        candidates = [r for r in self.replicas if r.state is _State.READY] or self.replicas
        start = self._next_replica = (self._next_replica + 1) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda replica: replica.load)

    def _count(self, result: ToolResult) -> ToolResult:
        if result.ok:
            self._ok += 1
        elif result.error_kind is not None:
            self._errors[result.error_kind.value] = self._errors.get(result.error_kind.value, 0) + 1
        return result

    def stats(self) -> dict[str, Any]:
        return {
            "transport": self.config.transport,
            "replicas": len(self.replicas),
            "calls": self._calls,
            "ok": self._ok,
            "errors": dict(self._errors),
            "cache_hits": self._cache_hits,
            "restarts": sum(r.restarts for r in self.replicas),
            "restart_failures": sum(r.restart_failures for r in self.replicas),
            "in_flight": sum(r.load for r in self.replicas),
        }


class _State(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    FAILED = "failed"  # the last (re)start attempt failed; the next one waits out a backoff
    CLOSED = "closed"


class _Unavailable(Exception):
    """The replica has no usable connection for this call."""


class _CallGuard:
    """One in-flight call: its cancel scope (the call's deadline) and why it was cut short, if it was."""

    def __init__(self, timeout_s: float) -> None:
        self.scope = anyio.CancelScope(deadline=anyio.current_time() + timeout_s)
        self.generation = -1
        self.sent = False  # the request went to the server (else the call was waiting for a session)
        self.cut_short: tuple[ErrorKind, str] | None = None

    def cut(self, kind: ErrorKind, message: str) -> None:
        if self.cut_short is None:
            self.cut_short = (kind, message)
            self.scope.cancel()


class _Replica:
    """One process (stdio) or HTTP session of a server, kept alive by its own supervisor task."""

    def __init__(self, config: MCPServerConfig, index: int, timeout_s: float) -> None:
        self.config = config
        self.index = index
        self.timeout_s = timeout_s
        self.label = config.name if config.replicas == 1 else f"{config.name}#{index}"
        self.load = 0  # calls assigned and not finished, queued ones included
        self.restarts = 0
        self.restart_failures = 0
        self.tools: list[mcp_types.Tool] = []
        self.state = _State.CONNECTING
        self._state_changed = asyncio.Event()
        self._wake = asyncio.Event()  # the supervisor's doorbell: stop, death, suspicion, retry request
        self._stopping = False
        self._suspect = False
        self._retry_requested = False
        self._client: Client | None = None
        self._generation = 0
        self._guards: set[_CallGuard] = set()
        self._limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
        self._last_error = "not started"
        self._retry_at = 0.0
        self._backoff_s = RETRY_BACKOFF_S[0]
        self._started_once = False
        self._task: asyncio.Task[None] | None = None

    # -- the caller's side --------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise(), name=f"mcp-{self.label}")

    async def wait_started(self) -> str | None:
        """Wait for the first connection attempt: None when up, else the reason it failed."""
        while self.state is _State.CONNECTING:
            await self._wait_state_change()
        return None if self.state is _State.READY else self._last_error

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is None:
            self._set_state(_State.CLOSED)
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), STOP_TIMEOUT_S)
        except TimeoutError:
            logger.warning(
                "MCP server %r did not shut down within %s s; cancelling it", self.label, STOP_TIMEOUT_S
            )
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def call(self, call: ToolCall) -> ToolResult:
        started = time.perf_counter()
        guard = _CallGuard(self.timeout_s)
        self.load += 1
        try:
            with guard.scope:
                async with self._limit or nullcontext():
                    result = await self._call_on_client(call, guard)
            if guard.scope.cancelled_caught and guard.cut_short is None:
                guard.cut_short = self._deadline_failure(call, guard)
            if guard.cut_short is None:
                return _tool_result(call, result, time.perf_counter() - started)
            kind, message = guard.cut_short
        except _Unavailable as exc:
            kind, message = ErrorKind.SERVER_UNAVAILABLE, str(exc)
        except Exception as exc:
            kind, message = self._classify_failure(exc, guard)
        finally:
            self.load -= 1
        return ToolResult.failure(call, kind, message, time.perf_counter() - started)

    def _deadline_failure(self, call: ToolCall, guard: _CallGuard) -> tuple[ErrorKind, str]:
        limit = f"{self.timeout_s:g} s"
        if guard.sent:
            return ErrorKind.TIMEOUT, f"{call.name!r} timed out after {limit}"
        if self.state is _State.READY:
            return ErrorKind.TIMEOUT, f"{call.name!r} waited {limit} for a free slot (max_concurrency)"
        return (
            ErrorKind.SERVER_UNAVAILABLE,
            f"server {self.label!r} did not come up within the call's {limit} timeout",
        )

    async def _call_on_client(self, call: ToolCall, guard: _CallGuard) -> mcp_types.CallToolResult:
        client = await self._client_for_call()
        guard.generation = self._generation
        self._guards.add(guard)
        try:
            guard.sent = True
            return await client.call_tool(call.name, call.arguments)
        finally:
            self._guards.discard(guard)

    async def _client_for_call(self) -> Client:
        while True:
            if self.state is _State.READY and self._client is not None:
                return self._client
            if self.state is _State.CLOSED or self._stopping:
                raise _Unavailable(f"server {self.label!r} is stopped (the tool pool was closed)")
            if self.state is _State.FAILED:
                wait_s = self._retry_at - time.monotonic()
                if wait_s > 0:
                    raise _Unavailable(
                        f"server {self.label!r} could not be restarted ({self._last_error}); "
                        f"next attempt in {wait_s:.1f} s"
                    )
                self._retry_requested = True
                self._set_state(_State.CONNECTING)
                self._wake.set()
            await self._wait_state_change()

    def _classify_failure(self, exc: Exception, guard: _CallGuard) -> tuple[ErrorKind, str]:
        if self._stopping:
            return (
                ErrorKind.SERVER_UNAVAILABLE,
                f"server {self.label!r} was stopped (the tool pool was closed)",
            )
        if isinstance(exc, MCPError):
            if exc.code == mcp_types.CONNECTION_CLOSED or exc.message == "Session terminated":
                self._report_connection_failure(guard.generation)
                return (
                    ErrorKind.SERVER_DIED,
                    f"server {self.label!r} connection lost during the call ({exc.message})",
                )
            if exc.code == mcp_types.REQUEST_TIMEOUT:
                return ErrorKind.TIMEOUT, exc.message
            if exc.code == mcp_types.INVALID_PARAMS:
                return ErrorKind.BAD_ARGUMENTS, exc.message
            return ErrorKind.TOOL_ERROR, f"{exc.message} (MCP error {exc.code})"
        if isinstance(
            exc,
            OSError
            | TimeoutError
            | httpx2.TransportError
            | anyio.BrokenResourceError
            | anyio.ClosedResourceError,
        ):
            self._report_connection_failure(guard.generation)
            return ErrorKind.SERVER_DIED, f"server {self.label!r} connection failed: {_describe(exc)}"
        if isinstance(exc, RuntimeError | pydantic.ValidationError):
            # The SDK's own checks of the result: output schema mismatch, malformed or unexpected result.
            return ErrorKind.TOOL_ERROR, f"the server returned an invalid result: {_describe(exc)}"
        logger.exception("MCP call on %r failed", self.label)
        return ErrorKind.TOOL_ERROR, _describe(exc)

    def _report_connection_failure(self, generation: int) -> None:
        """A call saw the connection fail: have the supervisor check it (a ping) and restart if dead."""
        if generation == self._generation and self.state is _State.READY:
            self._suspect = True
            self._wake.set()

    # -- the supervisor's side ----------------------------------------------------------------

    def _set_state(self, state: _State) -> None:
        self.state = state
        changed, self._state_changed = self._state_changed, asyncio.Event()
        changed.set()

    async def _wait_state_change(self) -> None:
        await self._state_changed.wait()

    async def _supervise(self) -> None:
        try:
            while not self._stopping:
                was_up = await self._run_connection()
                if self._stopping:
                    break
                if was_up:
                    self._set_state(_State.CONNECTING)  # died: restart right away
                    continue
                if self._started_once:
                    self.restart_failures += 1
                self._retry_at = time.monotonic() + self._backoff_s
                self._backoff_s = min(self._backoff_s * 2, RETRY_BACKOFF_S[1])
                self._set_state(_State.FAILED)
                # Restart on demand: the next call past the backoff asks for it.
                while not (self._stopping or self._retry_requested):
                    self._wake.clear()
                    await self._wake.wait()
                self._retry_requested = False
        except Exception:
            logger.exception("MCP supervisor of %r crashed", self.label)
            self._last_error = "the connection supervisor crashed (see the log)"
        finally:
            self._client = None
            self._cut_in_flight(ErrorKind.SERVER_UNAVAILABLE, f"server {self.label!r} was stopped")
            self._set_state(_State.CLOSED)

    async def _run_connection(self) -> bool:
        """Open, serve and close one connection; True when it came up (whatever ended it)."""
        self._suspect = False
        was_up = False
        stderr = _StderrTail(self.label) if self.config.command is not None else None
        limit_s = self.config.start_timeout_s
        try:
            # The deadline scope encloses the whole connection so that every context inside it
            # still exits in order; it only fires while the connection is coming up.
            with anyio.CancelScope() as startup:
                deadline = asyncio.get_running_loop().call_later(limit_s, startup.cancel)
                try:
                    async with AsyncExitStack() as stack:
                        # mode="auto": the 2026 protocol where the server speaks it (over HTTP a
                        # cancelled call then aborts its own POST instead of queueing a
                        # notification), the initialize handshake otherwise.
                        connection = Client(
                            self._open_transport(stderr), mode="auto", cache=None, client_info=CLIENT_INFO
                        )
                        client = await stack.enter_async_context(connection)
                        self.tools = await _list_all_tools(client)
                        deadline.cancel()
                        was_up = True
                        self._publish(client)
                        await self._serve(client)
                        self._withdraw("the pool was closed" if self._stopping else "the connection ended")
                finally:
                    deadline.cancel()
            if startup.cancelled_caught:
                raise TimeoutError(f"no answer to the handshake and tools/list within {limit_s:g} s")
        except Exception as exc:
            if was_up:
                self._withdraw(_describe(exc))
            else:
                tail = await stderr.final_tail() if stderr is not None else ""
                self._last_error = _describe(exc) + (f"; server stderr:\n{tail}" if tail else "")
                logger.warning("MCP server %r failed to start: %s", self.label, self._last_error)
        finally:
            if stderr is not None:
                if was_up and not self._stopping and (tail := await stderr.final_tail(0.5)):
                    logger.warning("last stderr lines of MCP server %r:\n%s", self.label, tail)
                stderr.close()
        return was_up

    @asynccontextmanager
    async def _open_transport(self, stderr: _StderrTail | None) -> AsyncIterator[Any]:
        """The transport's streams, the read side watched so a dead server is noticed at once."""
        config = self.config
        if config.command is not None:
            assert stderr is not None
            await stderr.start()
            # The parent's environment (PATH, PYTHONPATH, keys), not the SDK's minimal default.
            env = {"FASTMCP_LOG_LEVEL": "WARNING", **os.environ, **config.env}
            params = StdioServerParameters(
                command=config.command, args=list(config.args), env=env, cwd=config.cwd
            )
            async with stdio_client(params, errlog=stderr.child_end) as (read, write):
                stderr.child_spawned()
                yield _WatchedReadStream(read, on_end=self._on_transport_end), write
        else:
            assert config.url is not None
            # Unbounded connections: every in-flight call holds one POST (its SSE response) open.
            limits = httpx2.Limits(max_connections=None, max_keepalive_connections=64)
            timeout = httpx2.Timeout(10.0, read=max(300.0, self.timeout_s + 60.0))
            http = httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout, limits=limits)
            async with http, streamable_http_client(config.url, http_client=http) as (read, write):
                yield _WatchedReadStream(read, on_end=self._on_transport_end), write

    def _publish(self, client: Client) -> None:
        self._generation += 1
        self._client = client
        if self._started_once:
            self.restarts += 1
            logger.info("MCP server %r restarted", self.label)
        self._started_once = True
        self._backoff_s = RETRY_BACKOFF_S[0]
        self._set_state(_State.READY)

    async def _serve(self, client: Client) -> None:
        """Return once the connection is withdrawn (it died) or the pool stops."""
        while self._client is client and not self._stopping:
            if self._suspect:
                self._suspect = False
                try:
                    with anyio.fail_after(PING_TIMEOUT_S):
                        await client.send_ping()
                except Exception as exc:
                    self._withdraw(f"health check failed: {_describe(exc)}")
                continue
            self._wake.clear()
            await self._wake.wait()

    def _withdraw(self, reason: str) -> None:
        """The connection is no longer usable: new calls wait for the restart, in-flight calls fail now."""
        if self._client is None:
            return
        self._client = None
        if self._stopping:
            self._cut_in_flight(ErrorKind.SERVER_UNAVAILABLE, f"server {self.label!r} was stopped")
            return
        self._set_state(_State.CONNECTING)
        logger.warning("MCP server %r connection lost (%s); restarting it", self.label, reason)
        self._cut_in_flight(ErrorKind.SERVER_DIED, f"server {self.label!r} died during the call ({reason})")

    def _on_transport_end(self) -> None:
        # Called by the session's read loop the moment the transport ends (a stdio server's stdout
        # closes when its process dies): fail the in-flight calls now, not when each times out.
        self._withdraw(
            "the server process exited" if self.config.command is not None else "the connection closed"
        )
        self._wake.set()

    def _cut_in_flight(self, kind: ErrorKind, message: str) -> None:
        # The SDK already fails pending requests when its read loop ends; this also covers the
        # paths where a request could otherwise wait for an answer that will never come.
        for guard in list(self._guards):
            guard.cut(kind, message)
        self._guards.clear()


class _WatchedReadStream:
    """The transport's read stream, calling ``on_end`` when it ends (the server is gone)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _StderrTail(asyncio.Protocol):
    """A stdio server's stderr: forwarded to debug logging, its last lines kept for error messages.

    Servers log to stderr (MCPServer logs every request at INFO by default); a pipe we read keeps
    that off the trainer's console while still explaining a server that fails to start.
    """

    def __init__(self, label: str) -> None:
        read_fd, write_fd = os.pipe()
        self.child_end = os.fdopen(write_fd, "w")
        self._read_file = os.fdopen(read_fd, "rb", buffering=0)
        self._label = label
        self._lines: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._partial = b""
        self._transport: asyncio.ReadTransport | None = None
        self._eof = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.connect_read_pipe(lambda: self, self._read_file)

    def child_spawned(self) -> None:
        # Our copy of the write end must go, or the pipe never reaches EOF when the child exits.
        self.child_end.close()

    def data_received(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            self._lines.append(line)
            logger.debug("[%s stderr] %s", self._label, line)

    def eof_received(self) -> bool:
        if self._partial:
            self.data_received(b"\n")
        self._eof.set()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof.set()

    async def final_tail(self, wait_s: float = 1.0) -> str:
        """The last lines, after waiting briefly for a dead child's last words to arrive."""
        self.child_spawned()
        if self._transport is not None:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._eof.wait(), wait_s)
        return "\n".join(self._lines)

    def close(self) -> None:
        self.child_end.close()
        if self._transport is not None:
            self._transport.close()
        else:
            self._read_file.close()


async def _list_all_tools(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _tool_result(call: ToolCall, result: mcp_types.CallToolResult, latency_s: float) -> ToolResult:
    text = result_text(result)
    if result.is_error:
        kind = ErrorKind.BAD_ARGUMENTS if _SERVER_VALIDATION_ERROR.search(text) else ErrorKind.TOOL_ERROR
        return ToolResult.failure(
            call, kind, text or "the tool reported an error without a message", latency_s
        )
    return ToolResult(
        call=call, text=text, ok=True, latency_s=latency_s, structured=result.structured_content
    )


def result_text(result: mcp_types.CallToolResult) -> str:
    """What the model reads of an MCP tool result: text blocks joined, other blocks described briefly,
    the structured content as JSON when there is no text. Never truncated (the caller does that).

    Example:
        >>> result_text(mcp_types.CallToolResult(content=[], structured_content={"rows": 2}))
        '{"rows": 2}'
    """
    parts: list[str] = []
    has_text = False
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
            has_text = True
        elif isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
            kind = "image" if isinstance(block, mcp_types.ImageContent) else "audio"
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(
                f"[resource link: {block.uri}" + (f" ({block.description})]" if block.description else "]")
            )
        elif isinstance(block, mcp_types.EmbeddedResource):
            resource = block.resource
            if isinstance(resource, mcp_types.TextResourceContents):
                parts.append(resource.text)
                has_text = True
            else:
                parts.append(f"[resource: {resource.uri}, {resource.mime_type or 'binary'}]")
        else:
            parts.append(f"[{getattr(block, 'type', type(block).__name__)} content]")
    if not has_text and result.structured_content is not None:
        parts.insert(0, json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _describe(exc: BaseException) -> str:
    """A one-line reason; exception groups (anyio task groups) are flattened to their leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    if isinstance(exc, MCPError) and exc.code == mcp_types.CONNECTION_CLOSED:
        return f"connection closed ({exc.message})"
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
