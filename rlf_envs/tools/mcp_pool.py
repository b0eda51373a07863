"""MCP servers as tools: one long-lived client pool per env process, stdio and streamable HTTP.

:class:`MCPToolPool` starts every configured server (``replicas`` processes or HTTP sessions each),
lists their tools, and turns every :class:`ToolCall` into a :class:`ToolResult` without ever
raising: unknown tools, arguments that fail the tool's input schema, tool errors, timeouts, a
server that dies mid-call or cannot be restarted all come back as results with an
:class:`ErrorKind`. Calls run concurrently (one stdio session carries hundreds of requests in
flight); a dead server is restarted in the background so the next call finds it up again.

The pool routes each call by tool name to its server (a ``_Server``: the server's replicas, tools,
result cache and counters), which checks the arguments against the tool's input schema
(:mod:`~rlf_envs.tools.mcp_schema`), answers repeats from its cache
(:mod:`~rlf_envs.tools.mcp_cache`) and sends the rest to its least-loaded replica. A server given
as several ``urls`` has ``replicas`` sessions on each URL, all in one balance. A call that surely
never reached its replica (the replica had no session, or the HTTP request was refused before any
byte went out) goes to the next one; a call that may have reached it is never sent twice, since
tools can have side effects (docs/env_contract.md, "MCP servers"). A replica is one session and
its supervisor; :mod:`~rlf_envs.tools.mcp_replica` documents its state machine (restarts, and what
happens to in-flight calls), :mod:`~rlf_envs.tools.mcp_errors` how a failure becomes an
:class:`ErrorKind`. Everything runs on the caller's asyncio loop.

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
import logging
import os
import time
from dataclasses import replace
from typing import Any

from rlf_envs.tools.mcp_cache import ResultCache
from rlf_envs.tools.mcp_config import MCPConfigError, MCPServerConfig, load_mcp_config
from rlf_envs.tools.mcp_errors import MCPServerStartError
from rlf_envs.tools.mcp_replica import MCPReplica, ReplicaState
from rlf_envs.tools.mcp_schema import RemoteTool, result_text
from rlf_envs.types import ErrorKind, ToolCall, ToolResult, ToolSpec

__all__ = ["MCPConfigError", "MCPServerStartError", "MCPToolPool", "result_text"]

logger = logging.getLogger(__name__)


class MCPToolPool:
    """A :class:`~rlf_envs.types.ToolProvider` over the MCP servers of an ``mcpServers`` config.

    Args:
        config: the ``mcpServers`` JSON as a dict (with or without the outer key), a JSON string,
            or a path to a JSON file; see :mod:`rlf_envs.tools.mcp_config` for the keys.
        tool_timeout_s: per-call timeout for servers without their own ``timeout_s``.

    Raises:
        MCPConfigError: at construction for a malformed config; from :meth:`start` when two
            servers offer a tool of the same name.

    Example:
        >>> pool = MCPToolPool({"search": {"url": "http://127.0.0.1:8765/mcp", "replicas": 2}})
        >>> pool.stats()["search"]["replicas"]
        2
    """

    def __init__(
        self, config: dict[str, Any] | str | os.PathLike[str], *, tool_timeout_s: float = 30.0
    ) -> None:
        if not tool_timeout_s > 0:
            raise MCPConfigError(f"tool_timeout_s must be > 0, got {tool_timeout_s!r}")
        self._servers = [_Server(cfg, tool_timeout_s) for cfg in load_mcp_config(config)]
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
        """Per server: transport, replicas, calls, ok, errors by kind, cache hits, failovers, restarts,
        in-flight, and ``by_replica`` (each replica's state, calls, in-flight calls, health checks)."""
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


class _Server:
    """One configured server: its replicas, tools, cache and counters."""

    def __init__(self, config: MCPServerConfig, default_timeout_s: float) -> None:
        self.config = config
        self.name = config.name
        self.timeout_s = config.timeout_s or default_timeout_s
        self.replicas = _build_replicas(config, self.timeout_s)
        self.tools: dict[str, RemoteTool] = {}
        self._cache = ResultCache(config.cache_size) if config.cache_size else None
        self._next_replica = 0
        self._calls = 0
        self._ok = 0
        self._cache_hits = 0
        self._failovers = 0
        self._errors: dict[str, int] = {}

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    async def wait_started(self) -> str | None:
        """None once the server can serve (tools listed), else why its replicas failed to start.

        Every replica must come up, except with several ``urls``: one URL up is enough there, and
        the others are logged and tried again like any replica that went down (a host may be down
        when a run starts).
        """
        reasons = await asyncio.gather(*(replica.wait_started() for replica in self.replicas))
        failed = {r.label: reason for r, reason in zip(self.replicas, reasons, strict=True) if reason}
        up = [r for r in self.replicas if r.label not in failed]
        if failed and (len(self.config.urls) <= 1 or not up):
            if len(self.replicas) == 1:
                return next(iter(failed.values()))
            return "; ".join(f"replica {label}: {reason}" for label, reason in failed.items())
        for label, reason in failed.items():
            logger.warning(
                "MCP server %r: %s is down at start (%s); the other URLs serve", self.name, label, reason
            )
        self.tools = {tool.name: RemoteTool.from_mcp(tool) for tool in up[0].tools}
        for replica in up[1:]:
            if {tool.name for tool in replica.tools} != set(self.tools):
                logger.warning(
                    "MCP server %r: %s lists other tools than %s; calls are checked against the latter's",
                    self.name,
                    replica.label,
                    up[0].label,
                )
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
        key = ResultCache.key(call) if cache is not None else None
        if cache is not None and key is not None and (hit := cache.get(key)) is not None:
            self._cache_hits += 1
            return self._count(replace(hit, call=call, cached=True, latency_s=time.perf_counter() - started))
        result = await self._call_with_failover(call, started)
        if cache is not None and key is not None and result.ok:
            cache.put(key, result)
        return self._count(result)

    async def _call_with_failover(self, call: ToolCall, started: float) -> ToolResult:
        """The least-loaded replica runs the call; one that surely never got it passes it to the next.

        At most once: a call whose request may have reached a replica is never sent again (tools
        may have side effects), so a replica dying under it gives ``server_died``. All replicas
        together stay within the server's ``timeout_s``.
        """
        deadline = time.monotonic() + self.timeout_s
        missed: list[ToolResult] = []
        tried: set[int] = set()
        while (replica := self._least_loaded_replica(tried)) is not None:
            remaining_s = round(deadline - time.monotonic(), 2)
            if missed and remaining_s <= 0:
                break
            attempt = await replica.attempt(call, remaining_s if missed else None)
            if attempt.delivered:
                return attempt.result
            missed.append(attempt.result)
            tried.add(replica.index)
            self._failovers += 1
        if len(missed) == 1:
            return missed[0]
        reasons = "; ".join(result.text for result in missed)
        message = f"no replica of server {self.name!r} could take the call: {reasons}"
        return ToolResult.failure(call, ErrorKind.SERVER_UNAVAILABLE, message, time.perf_counter() - started)

    def _least_loaded_replica(self, tried: set[int]) -> MCPReplica | None:
        """Up replicas first, then ones coming up; ``None`` once every replica was tried."""
        for replica in self.replicas:
            replica.retry_if_due()  # a replica that was taken out gets its next attempt in the background
        untried = [r for r in self.replicas if r.index not in tried]
        if not untried:
            return None
        candidates = (
            [r for r in untried if r.state is ReplicaState.READY]
            or [r for r in untried if r.state is ReplicaState.CONNECTING]
            or untried
        )
        # Rotate the start so equal loads still spread the calls.
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
            "failovers": self._failovers,
            "restarts": sum(r.restarts for r in self.replicas),
            "restart_failures": sum(r.restart_failures for r in self.replicas),
            "in_flight": sum(r.load for r in self.replicas),
            "by_replica": {
                r.label: {
                    "state": r.state.value,
                    "calls": r.calls,
                    "in_flight": r.load,
                    "health_checks": r.health_checks,
                }
                for r in self.replicas
            },
        }


def _build_replicas(config: MCPServerConfig, timeout_s: float) -> list[MCPReplica]:
    """``replicas`` per endpoint: the stdio command or the one URL, or each of several ``urls``."""
    if len(config.urls) <= 1:
        return [MCPReplica(config, index, timeout_s) for index in range(config.replicas)]
    replicas: list[MCPReplica] = []
    for url in config.urls:
        own = replace(config, url=url)
        for session in range(config.replicas):
            label = f"{config.name}@{url}" + (f"#{session}" if config.replicas > 1 else "")
            replicas.append(MCPReplica(own, len(replicas), timeout_s, label=label))
    return replicas
