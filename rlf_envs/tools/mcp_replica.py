"""One replica of an MCP server: one session (a stdio process or an HTTP session) and its supervisor.

A :class:`MCPReplica` runs calls concurrently on its session and never raises for one: every
failure comes back as a :class:`ToolResult` with an :class:`ErrorKind`; :meth:`MCPReplica.attempt`
also says whether the call's request may have reached the server (the pool sends a call that
surely did not to another replica). Its connection lives in a
:class:`~rlf_envs.tools.mcp_supervisor.ConnectionSupervisor` task, which opens the transport and
the session, publishes the session, waits until the connection dies or the replica stops, and
tears it down.

The state machine (:class:`ReplicaState`)::

        MCPReplica(...)       start() runs the first attempt
              |
              v
    +--> CONNECTING ----------- attempt failed ----------> FAILED
    |      |     ^          (retry_at = now + backoff)        |
    |      |     |                                            |
    |      |     +------- a call past the backoff ------------+
    |      | session up, tools listed
    |      v
    +--- READY
    connection lost: the process died, the transport or session ended, a health check failed
    (in-flight calls cut as server_died; the restart begins at once, without backoff)

    stop(), from any state -------------------------------> CLOSED (final: never restarted)

====================  ========================================  ========================================
transition            trigger                                   calls
====================  ========================================  ========================================
(new) -> CONNECTING   construction; ``start()`` creates the     calls wait for the attempt's outcome,
                      supervisor, which opens the transport     each within its own ``timeout_s`` (past
                      (spawns the process), handshakes and      it: ``server_unavailable``, "did not
                      lists the tools within                    come up")
                      ``start_timeout_s``
CONNECTING -> READY   the session is up and ``tools/list``      waiting calls go out on the new session;
                      answered: generation + 1, backoff         ``restarts`` + 1 if it had been up
                      reset to 0.5 s                            before
CONNECTING -> FAILED  the attempt failed: spawn error,          waiting calls fail at once as
                      handshake or ``tools/list`` error, no     ``server_unavailable`` (the reason with
                      answer within ``start_timeout_s``;        the server's stderr tail, and the time
                      ``retry_at`` = now + backoff, then the    to the next attempt);
                      backoff doubles (0.5 s up to 30 s)        ``restart_failures`` + 1 if it had been
                                                                up before
READY -> CONNECTING   the transport ended (a stdio server's     in-flight calls are cut as
                      stdout closed: its process died; the      ``server_died``; new calls wait for the
                      HTTP stream closed), the session raised   restart, which begins at once
                      or ended, or a health check failed
FAILED -> CONNECTING  a call arrives past ``retry_at``, to      calls before ``retry_at`` fail at once
                      this replica or to another replica of     as ``server_unavailable``; a call to
                      its server (restarts are on demand: no    this replica waits for the attempt
                      call, no attempt)
any -> CLOSED         ``stop()`` (the pool's ``aclose()``, or   in-flight calls are cut as
                      a pool start that failed), or the         ``server_unavailable`` ("was stopped");
                      supervisor crashing                       waiting and later calls get it too
====================  ========================================  ========================================

Within READY: a call past its ``timeout_s`` cancels only its own request (``timeout``; a call
still waiting for a ``max_concurrency`` slot gets ``timeout`` too). A call whose exception says
the connection failed (connection closed or session terminated, an ``OSError`` or
``TimeoutError``, an HTTP transport error, a broken or closed stream) returns ``server_died`` and
has the supervisor check the session (a ``tools/list`` request, within
``mcp_supervisor.HEALTH_CHECK_TIMEOUT_S``; any answer passes): the exception changes no state, only
a failed check takes READY to CONNECTING. When the server has several ``urls``, a call past its
``timeout_s`` has the session checked too: a host that stopped answering is taken out that way.

After ``stop()`` calls in flight and new ones get ``server_unavailable``, while the state reads
what it was until the supervisor has torn the connection down: an attempt in CONNECTING runs on
(within ``start_timeout_s``), and a session that comes up is withdrawn before any call can use it
(READY during the teardown). ``stop()`` waits up to ``mcp_supervisor.STOP_TIMEOUT_S``, then
cancels the supervisor.

Example:
    >>> import asyncio, sys
    >>> from rlf_envs.tools.mcp_config import load_mcp_config
    >>> [config] = load_mcp_config({"latency": {"command": sys.executable,
    ...     "args": ["-m", "rlf_envs.servers.latency", "--latency-ms", "5"]}})
    >>> async def demo():
    ...     replica = MCPReplica(config, index=0, timeout_s=30.0)
    ...     replica.start()
    ...     await replica.wait_started()
    ...     result = await replica.call(ToolCall("sleep", {"payload": "hi"}))
    ...     ready = replica.state
    ...     await replica.stop()
    ...     return ready.value, result.text, replica.state.value
    >>> asyncio.run(demo())
    ('ready', 'slept 5.0 ms: hi', 'closed')
"""

from __future__ import annotations

import asyncio
import time
from contextlib import nullcontext
from dataclasses import dataclass

import anyio
import mcp_types

from rlf_envs.tools.mcp_config import MCPServerConfig
from rlf_envs.tools.mcp_errors import CallFailure, classify_call_exception, deadline_failure
from rlf_envs.tools.mcp_schema import tool_result_from_mcp
from rlf_envs.tools.mcp_supervisor import ConnectionSupervisor, ReplicaState, ReplicaUnavailable
from rlf_envs.tools.mcp_transport import RequestDelivery, track_delivery
from rlf_envs.types import ErrorKind, ToolCall, ToolResult

__all__ = ["CallAttempt", "MCPReplica", "ReplicaState"]


@dataclass(frozen=True)
class CallAttempt:
    """One call on one replica: its result, and whether the request may have reached the server.

    ``delivered`` is False only when the call surely never ran there: the replica had no session
    for it (stopped, or waiting out a backoff), or its HTTP request never began to go out (the
    connection was refused). Only such a call may be sent again elsewhere; see
    :mod:`~rlf_envs.tools.mcp_pool`.
    """

    result: ToolResult
    delivered: bool


class _CallGuard:
    """One in-flight call: its cancel scope (the call's deadline) and why it was cut short, if it was."""

    def __init__(self, timeout_s: float) -> None:
        self.scope = anyio.CancelScope(deadline=anyio.current_time() + timeout_s)
        self.generation = -1
        self.sent = False  # the request went to the session (else the call was waiting for one)
        self.delivery: RequestDelivery | None = None  # HTTP: whether the request began to go out
        self.cut_short: CallFailure | None = None

    @property
    def delivered(self) -> bool:
        if not self.sent:
            return False
        return self.delivery is None or self.delivery.sent

    def cut(self, kind: ErrorKind, message: str) -> None:
        if self.cut_short is None:
            self.cut_short = CallFailure(kind, message)
            self.scope.cancel()


class MCPReplica:
    """One process (stdio) or HTTP session of a server, kept alive by its own supervisor task.

    ``label`` names the replica in messages and logs; by default the server's name, with
    ``#index`` when the server has several replicas.
    """

    def __init__(
        self, config: MCPServerConfig, index: int, timeout_s: float, *, label: str | None = None
    ) -> None:
        self.config = config
        self.index = index
        self.timeout_s = timeout_s
        self.label = label or (config.name if config.replicas == 1 else f"{config.name}#{index}")
        self.load = 0  # calls assigned and not finished, queued ones included
        self.calls = 0  # calls assigned so far
        self._guards: set[_CallGuard] = set()
        self._limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
        self._supervisor = ConnectionSupervisor(config, self.label, timeout_s, on_lost=self._cut_in_flight)
        # A host that stops answering is taken out by a check after a timed-out call, where others can serve.
        self._check_after_timeout = len(config.urls) > 1

    @property
    def state(self) -> ReplicaState:
        return self._supervisor.state

    @property
    def tools(self) -> list[mcp_types.Tool]:
        return self._supervisor.tools

    @property
    def restarts(self) -> int:
        return self._supervisor.restarts

    @property
    def restart_failures(self) -> int:
        return self._supervisor.restart_failures

    @property
    def health_checks(self) -> int:
        return self._supervisor.health_checks

    def start(self) -> None:
        self._supervisor.start()

    async def wait_started(self) -> str | None:
        """Wait until the replica leaves CONNECTING: None when READY, else the reason it failed."""
        return await self._supervisor.wait_started()

    async def wait_state_change(self) -> None:
        """Return at the next transition (a transition to the same state counts too)."""
        await self._supervisor.wait_state_change()

    async def stop(self) -> None:
        await self._supervisor.stop()

    def retry_if_due(self) -> bool:
        """FAILED and past its backoff: start the next attempt without a call waiting on it."""
        return self._supervisor.retry_if_due()

    async def call(self, call: ToolCall) -> ToolResult:
        """Run one call on this replica; never raises (but for the caller's own cancellation)."""
        return (await self.attempt(call)).result

    async def attempt(self, call: ToolCall, timeout_s: float | None = None) -> CallAttempt:
        """Run one call within ``timeout_s`` (default: the replica's), saying whether it may have run."""
        started = time.perf_counter()
        limit_s = self.timeout_s if timeout_s is None else timeout_s
        guard = _CallGuard(limit_s)
        self.calls += 1
        self.load += 1
        try:
            with guard.scope:
                async with self._limit or nullcontext():
                    result = await self._call_on_client(call, guard)
            if guard.scope.cancelled_caught and guard.cut_short is None:
                guard.cut_short = self._deadline_failure(call, guard, limit_s)
            if guard.cut_short is None:
                return CallAttempt(tool_result_from_mcp(call, result, time.perf_counter() - started), True)
            failure = guard.cut_short
        except ReplicaUnavailable as exc:
            failure = CallFailure(ErrorKind.SERVER_UNAVAILABLE, str(exc))
        except Exception as exc:
            failure = classify_call_exception(exc, self.label, stopping=self._supervisor.stopping)
            if failure.connection_failed:
                self._supervisor.check_health(guard.generation)
        finally:
            self.load -= 1
        result = ToolResult.failure(call, failure.kind, failure.message, time.perf_counter() - started)
        return CallAttempt(result, guard.delivered or self._supervisor.stopping)

    def _deadline_failure(self, call: ToolCall, guard: _CallGuard, limit_s: float) -> CallFailure:
        if guard.sent and self._check_after_timeout:
            self._supervisor.check_health(guard.generation)
        ready = self.state is ReplicaState.READY
        return deadline_failure(call.name, limit_s, self.label, sent=guard.sent, ready=ready)

    async def _call_on_client(self, call: ToolCall, guard: _CallGuard) -> mcp_types.CallToolResult:
        client = await self._supervisor.client_for_call()
        guard.generation = self._supervisor.generation
        self._guards.add(guard)
        try:
            guard.sent = True
            if self.config.command is not None:
                return await client.call_tool(call.name, call.arguments)
            with track_delivery() as guard.delivery:
                return await client.call_tool(call.name, call.arguments)
        finally:
            self._guards.discard(guard)

    def _cut_in_flight(self, kind: ErrorKind, message: str) -> None:
        # The SDK already fails pending requests when its read loop ends; this also covers the
        # paths where a request could otherwise wait for an answer that will never come.
        for guard in list(self._guards):
            guard.cut(kind, message)
        self._guards.clear()
