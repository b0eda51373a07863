"""One replica of an MCP server: one session (a stdio process or an HTTP session) and its supervisor.

A :class:`MCPReplica` runs calls concurrently on its session and never raises for one: every
failure comes back as a :class:`ToolResult` with an :class:`ErrorKind`. Its connection lives in
its own supervisor task, which opens the transport and the session, publishes the session, waits
until the connection dies or the replica stops, and tears it down: anyio/MCP context managers are
always entered and exited by that one task, on the caller's asyncio loop. Connections negotiate
like ``mcp.Client(mode="auto")``: the 2026-07-28 protocol where the server offers it, the
initialize handshake otherwise.

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
    connection lost: the process died, the transport or session ended, a ping failed
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
                      or ended, or a health-check ping failed
FAILED -> CONNECTING  a call arrives past ``retry_at``          calls before ``retry_at`` fail at once
                      (restarts are on demand: no call, no      as ``server_unavailable``; this one
                      attempt)                                  waits for the attempt
any -> CLOSED         ``stop()`` (the pool's ``aclose()``, or   in-flight calls are cut as
                      a pool start that failed), or the         ``server_unavailable`` ("was stopped");
                      supervisor crashing                       waiting and later calls get it too
====================  ========================================  ========================================

Within READY: a call past its ``timeout_s`` cancels only its own request (``timeout``; a call
still waiting for a ``max_concurrency`` slot gets ``timeout`` too). A call whose exception says
the connection failed (connection closed or session terminated, an ``OSError`` or
``TimeoutError``, an HTTP transport error, a broken or closed stream) returns ``server_died`` and
has the supervisor ping the session (within ``PING_TIMEOUT_S``): the exception changes no state,
only a failed ping takes READY to CONNECTING.

After ``stop()`` calls in flight and new ones get ``server_unavailable``, while the state reads
what it was until the supervisor has torn the connection down: an attempt in CONNECTING runs on
(within ``start_timeout_s``), and a session that comes up is withdrawn before any call can use it
(READY during the teardown). ``stop()`` waits up to ``STOP_TIMEOUT_S``, then cancels the supervisor.

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
import enum
import logging
import time
from contextlib import AsyncExitStack, nullcontext

import anyio
import mcp_types
from mcp import Client

from rlf_envs.tools.mcp_config import MCPServerConfig
from rlf_envs.tools.mcp_errors import (
    CallFailure,
    classify_call_exception,
    deadline_failure,
    describe_exception,
)
from rlf_envs.tools.mcp_schema import tool_result_from_mcp
from rlf_envs.tools.mcp_transport import StderrTail, open_transport
from rlf_envs.types import ErrorKind, ToolCall, ToolResult

__all__ = ["MCPReplica", "ReplicaState"]

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="rlf", version="0.1.0")
PING_TIMEOUT_S = 5.0  # health check after a call saw the connection fail
RETRY_BACKOFF_S = (0.5, 30.0)  # first and largest wait between failed restart attempts
STOP_TIMEOUT_S = 15.0  # the SDK's own stdio shutdown is bounded at ~4.5 s; this is the backstop


class ReplicaState(enum.Enum):
    """Where a replica's connection stands; the module docstring draws the transitions."""

    CONNECTING = "connecting"  # an attempt is running (or, before start(), about to)
    READY = "ready"  # a session is published: calls go out on it
    FAILED = "failed"  # the last (re)start attempt failed; the next one waits out a backoff
    CLOSED = "closed"  # stopped for good


class _ReplicaUnavailable(Exception):
    """The replica has no usable connection for this call."""


class _CallGuard:
    """One in-flight call: its cancel scope (the call's deadline) and why it was cut short, if it was."""

    def __init__(self, timeout_s: float) -> None:
        self.scope = anyio.CancelScope(deadline=anyio.current_time() + timeout_s)
        self.generation = -1
        self.sent = False  # the request went to the server (else the call was waiting for a session)
        self.cut_short: CallFailure | None = None

    def cut(self, kind: ErrorKind, message: str) -> None:
        if self.cut_short is None:
            self.cut_short = CallFailure(kind, message)
            self.scope.cancel()


class MCPReplica:
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
        self.state = ReplicaState.CONNECTING
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
        """Wait until the replica leaves CONNECTING: None when READY, else the reason it failed."""
        while self.state is ReplicaState.CONNECTING:
            await self.wait_state_change()
        return None if self.state is ReplicaState.READY else self._last_error

    async def wait_state_change(self) -> None:
        """Return at the next transition (a transition to the same state counts too)."""
        await self._state_changed.wait()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is None:
            self._set_state(ReplicaState.CLOSED)
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
                ready = self.state is ReplicaState.READY
                guard.cut_short = deadline_failure(
                    call.name, self.timeout_s, self.label, sent=guard.sent, ready=ready
                )
            if guard.cut_short is None:
                return tool_result_from_mcp(call, result, time.perf_counter() - started)
            failure = guard.cut_short
        except _ReplicaUnavailable as exc:
            failure = CallFailure(ErrorKind.SERVER_UNAVAILABLE, str(exc))
        except Exception as exc:
            failure = classify_call_exception(exc, self.label, stopping=self._stopping)
            if failure.connection_failed:
                self._report_connection_failure(guard.generation)
        finally:
            self.load -= 1
        return ToolResult.failure(call, failure.kind, failure.message, time.perf_counter() - started)

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
            if self.state is ReplicaState.READY and self._client is not None:
                return self._client
            if self.state is ReplicaState.CLOSED or self._stopping:
                raise _ReplicaUnavailable(f"server {self.label!r} is stopped (the tool pool was closed)")
            if self.state is ReplicaState.FAILED:
                wait_s = self._retry_at - time.monotonic()
                if wait_s > 0:
                    raise _ReplicaUnavailable(
                        f"server {self.label!r} could not be restarted ({self._last_error}); "
                        f"next attempt in {wait_s:.1f} s"
                    )
                self._retry_requested = True
                self._set_state(ReplicaState.CONNECTING)
                self._wake.set()
            await self.wait_state_change()

    def _report_connection_failure(self, generation: int) -> None:
        """A call saw the connection fail: have the supervisor check it (a ping) and restart if dead."""
        if generation == self._generation and self.state is ReplicaState.READY:
            self._suspect = True
            self._wake.set()

    # -- the supervisor's side ----------------------------------------------------------------

    def _set_state(self, state: ReplicaState) -> None:
        self.state = state
        changed, self._state_changed = self._state_changed, asyncio.Event()
        changed.set()

    async def _supervise(self) -> None:
        try:
            while not self._stopping:
                was_up = await self._run_connection()
                if self._stopping:
                    break
                if was_up:
                    self._set_state(ReplicaState.CONNECTING)  # died: restart right away
                    continue
                if self._started_once:
                    self.restart_failures += 1
                self._retry_at = time.monotonic() + self._backoff_s
                self._backoff_s = min(self._backoff_s * 2, RETRY_BACKOFF_S[1])
                self._set_state(ReplicaState.FAILED)
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
            self._set_state(ReplicaState.CLOSED)

    async def _run_connection(self) -> bool:
        """Open, serve and close one connection; True when it came up (whatever ended it)."""
        self._suspect = False
        was_up = False
        stderr = StderrTail(self.label) if self.config.command is not None else None
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
                        transport = open_transport(
                            self.config, stderr, call_timeout_s=self.timeout_s, on_end=self._on_transport_end
                        )
                        connection = Client(transport, mode="auto", cache=None, client_info=CLIENT_INFO)
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
                self._withdraw(describe_exception(exc))
            else:
                tail = await stderr.final_tail() if stderr is not None else ""
                self._last_error = describe_exception(exc) + (f"; server stderr:\n{tail}" if tail else "")
                logger.warning("MCP server %r failed to start: %s", self.label, self._last_error)
        finally:
            if stderr is not None:
                if was_up and not self._stopping and (tail := await stderr.final_tail(0.5)):
                    logger.warning("last stderr lines of MCP server %r:\n%s", self.label, tail)
                stderr.close()
        return was_up

    def _publish(self, client: Client) -> None:
        self._generation += 1
        self._client = client
        if self._started_once:
            self.restarts += 1
            logger.info("MCP server %r restarted", self.label)
        self._started_once = True
        self._backoff_s = RETRY_BACKOFF_S[0]
        self._set_state(ReplicaState.READY)

    async def _serve(self, client: Client) -> None:
        """Return once the connection is withdrawn (it died) or the replica stops."""
        while self._client is client and not self._stopping:
            if self._suspect:
                self._suspect = False
                try:
                    with anyio.fail_after(PING_TIMEOUT_S):
                        await client.send_ping()
                except Exception as exc:
                    self._withdraw(f"health check failed: {describe_exception(exc)}")
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
        self._set_state(ReplicaState.CONNECTING)
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


async def _list_all_tools(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
