"""The supervisor of one replica's connection: opens it, publishes the session, restarts it when it dies.

A :class:`ConnectionSupervisor` runs in its own task on the caller's asyncio loop, so the
anyio/MCP context managers of a connection are always entered and exited by that one task. It
drives the state machine that :mod:`~rlf_envs.tools.mcp_replica` draws and tables
(:class:`ReplicaState`); the replica runs its calls on the session published here and is told
through ``on_lost`` the moment that session is withdrawn, so it can cut the calls still in flight
on it. Connections negotiate like ``mcp.Client(mode="auto")``: the 2026-07-28 protocol where the
server offers it, the initialize handshake otherwise.

Example:
    >>> import asyncio, sys
    >>> from rlf_envs.tools.mcp_config import load_mcp_config
    >>> [config] = load_mcp_config({"latency": {"command": sys.executable,
    ...     "args": ["-m", "rlf_envs.servers.latency", "--latency-ms", "5"]}})
    >>> async def demo():
    ...     supervisor = ConnectionSupervisor(config, "latency", 30.0, on_lost=lambda kind, message: None)
    ...     supervisor.start()
    ...     reason = await supervisor.wait_started()
    ...     tools = sorted(tool.name for tool in supervisor.tools)
    ...     await supervisor.stop()
    ...     return reason, tools, supervisor.state.value
    >>> asyncio.run(demo())
    (None, ['reset_stats', 'sleep', 'stats'], 'closed')
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from contextlib import AsyncExitStack

import anyio
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError

from rlf_envs.tools.mcp_config import MCPServerConfig
from rlf_envs.tools.mcp_errors import describe_exception
from rlf_envs.tools.mcp_transport import StderrTail, open_transport
from rlf_envs.types import ErrorKind

__all__ = ["ConnectionSupervisor", "ReplicaState", "ReplicaUnavailable"]

logger = logging.getLogger(__name__)

CLIENT_INFO = mcp_types.Implementation(name="rlf", version="0.1.0")
HEALTH_CHECK_TIMEOUT_S = 5.0  # the check after a call saw the connection fail (or, with urls, time out)
RETRY_BACKOFF_S = (0.5, 30.0)  # first and largest wait between failed restart attempts
STOP_TIMEOUT_S = 15.0  # the SDK's own stdio shutdown is bounded at ~4.5 s; this is the backstop


class ReplicaState(enum.Enum):
    """Where a replica's connection stands; :mod:`~rlf_envs.tools.mcp_replica` draws the transitions."""

    CONNECTING = "connecting"  # an attempt is running (or, before start(), about to)
    READY = "ready"  # a session is published: calls go out on it
    FAILED = "failed"  # the last (re)start attempt failed; the next one waits out a backoff
    CLOSED = "closed"  # stopped for good


class ReplicaUnavailable(Exception):
    """The replica has no usable connection for a call: it is stopped, or waits out a backoff."""


class ConnectionSupervisor:
    """Keeps one session of a server (a stdio process or an HTTP session) up, in its own task.

    ``on_lost(kind, message)`` is called whenever the published session is withdrawn (it died, or
    the replica stops): the calls still in flight on it must fail with that kind and message.
    """

    def __init__(
        self,
        config: MCPServerConfig,
        label: str,
        call_timeout_s: float,
        on_lost: Callable[[ErrorKind, str], None],
    ) -> None:
        self.config = config
        self.label = label
        self.call_timeout_s = call_timeout_s
        self.state = ReplicaState.CONNECTING
        self.tools: list[mcp_types.Tool] = []
        self.client: Client | None = None
        self.generation = 0  # + 1 per published session, so a late report about an old one is ignored
        self.restarts = 0
        self.restart_failures = 0
        self.stopping = False
        self.health_checks = 0  # checks done (answered or not)
        self.last_error = "not started"
        self._on_lost = on_lost
        self._state_changed = asyncio.Event()
        self._wake = asyncio.Event()  # the supervisor's doorbell: stop, death, suspicion, retry request
        self._suspect = False
        self._retry_requested = False
        self._retry_at = 0.0
        self._backoff_s = RETRY_BACKOFF_S[0]
        self._started_once = False
        self._task: asyncio.Task[None] | None = None

    # -- what the replica asks ----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._supervise(), name=f"mcp-{self.label}")

    async def wait_started(self) -> str | None:
        """Wait until the connection leaves CONNECTING: None when READY, else the reason it failed."""
        while self.state is ReplicaState.CONNECTING:
            await self.wait_state_change()
        return None if self.state is ReplicaState.READY else self.last_error

    async def wait_state_change(self) -> None:
        """Return at the next transition (a transition to the same state counts too)."""
        await self._state_changed.wait()

    async def stop(self) -> None:
        self.stopping = True
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

    async def client_for_call(self) -> Client:
        """The published session, after waiting out an attempt that is running.

        Raises:
            ReplicaUnavailable: the replica is stopped, or FAILED and its backoff has not run out.
        """
        while True:
            if self.state is ReplicaState.READY and self.client is not None:
                return self.client
            if self.state is ReplicaState.CLOSED or self.stopping:
                raise ReplicaUnavailable(f"server {self.label!r} is stopped (the tool pool was closed)")
            if self.state is ReplicaState.FAILED and not self.retry_if_due():
                raise ReplicaUnavailable(
                    f"server {self.label!r} could not be restarted ({self.last_error}); "
                    f"next attempt in {self._retry_at - time.monotonic():.1f} s"
                )
            await self.wait_state_change()

    def retry_if_due(self) -> bool:
        """FAILED and past the backoff: begin the next attempt now. True when this started one."""
        if self.state is not ReplicaState.FAILED or self.stopping or time.monotonic() < self._retry_at:
            return False
        self._retry_requested = True
        self._set_state(ReplicaState.CONNECTING)
        self._wake.set()
        return True

    def check_health(self, generation: int) -> None:
        """A call saw the connection fail (or hang): check it, and restart it if it does not answer."""
        if generation == self.generation and self.state is ReplicaState.READY:
            self._suspect = True
            self._wake.set()

    # -- the supervisor's task ----------------------------------------------------------------

    def _set_state(self, state: ReplicaState) -> None:
        self.state = state
        changed, self._state_changed = self._state_changed, asyncio.Event()
        changed.set()

    async def _supervise(self) -> None:
        try:
            while not self.stopping:
                was_up = await self._run_connection()
                if self.stopping:
                    break
                if was_up:
                    self._set_state(ReplicaState.CONNECTING)  # died: restart right away
                    continue
                if self._started_once:
                    self.restart_failures += 1
                self._retry_at = time.monotonic() + self._backoff_s
                self._backoff_s = min(self._backoff_s * 2, RETRY_BACKOFF_S[1])
                self._set_state(ReplicaState.FAILED)
                # Restart on demand: the next call (to this replica or its server) past the backoff asks.
                while not (self.stopping or self._retry_requested):
                    self._wake.clear()
                    await self._wake.wait()
                self._retry_requested = False
        except Exception:
            logger.exception("MCP supervisor of %r crashed", self.label)
            self.last_error = "the connection supervisor crashed (see the log)"
        finally:
            self.client = None
            self._on_lost(ErrorKind.SERVER_UNAVAILABLE, f"server {self.label!r} was stopped")
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
                            self.config,
                            stderr,
                            call_timeout_s=self.call_timeout_s,
                            on_end=self._on_transport_end,
                        )
                        connection = Client(transport, mode="auto", cache=None, client_info=CLIENT_INFO)
                        client = await stack.enter_async_context(connection)
                        self.tools = await _list_all_tools(client)
                        deadline.cancel()
                        was_up = True
                        self._publish(client)
                        await self._serve(client)
                        self._withdraw("the pool was closed" if self.stopping else "the connection ended")
                finally:
                    deadline.cancel()
            if startup.cancelled_caught:
                raise TimeoutError(f"no answer to the handshake and tools/list within {limit_s:g} s")
        except Exception as exc:
            if was_up:
                self._withdraw(describe_exception(exc))
            else:
                tail = await stderr.final_tail() if stderr is not None else ""
                self.last_error = describe_exception(exc) + (f"; server stderr:\n{tail}" if tail else "")
                logger.warning("MCP server %r failed to start: %s", self.label, self.last_error)
        finally:
            if stderr is not None:
                if was_up and not self.stopping and (tail := await stderr.final_tail(0.5)):
                    logger.warning("last stderr lines of MCP server %r:\n%s", self.label, tail)
                stderr.close()
        return was_up

    def _publish(self, client: Client) -> None:
        self.generation += 1
        self.client = client
        if self._started_once:
            self.restarts += 1
            logger.info("MCP server %r restarted", self.label)
        self._started_once = True
        self._backoff_s = RETRY_BACKOFF_S[0]
        self._set_state(ReplicaState.READY)

    async def _serve(self, client: Client) -> None:
        """Return once the connection is withdrawn (it died) or the replica stops."""
        while self.client is client and not self.stopping:
            if self._suspect:
                self._suspect = False
                await self._check_health(client)
                continue
            self._wake.clear()
            await self._wake.wait()

    async def _check_health(self, client: Client) -> None:
        # tools/list, not ping: the 2026-07-28 protocol removed ping (servers answer "Method not
        # found"). Any answer, an error answer included, shows the session is alive.
        try:
            with anyio.fail_after(HEALTH_CHECK_TIMEOUT_S):
                await client.list_tools()
        except MCPError as exc:
            if (
                exc.code in (mcp_types.CONNECTION_CLOSED, mcp_types.REQUEST_TIMEOUT)
                or exc.message == "Session terminated"
            ):
                self._withdraw(f"health check failed: {describe_exception(exc)}")
        except Exception as exc:
            self._withdraw(f"health check failed: {describe_exception(exc)}")
        finally:
            self.health_checks += 1

    def _withdraw(self, reason: str) -> None:
        """The connection is no longer usable: new calls wait for the restart, in-flight calls fail now."""
        if self.client is None:
            return
        self.client = None
        if self.stopping:
            self._on_lost(ErrorKind.SERVER_UNAVAILABLE, f"server {self.label!r} was stopped")
            return
        self._set_state(ReplicaState.CONNECTING)
        logger.warning("MCP server %r connection lost (%s); restarting it", self.label, reason)
        self._on_lost(ErrorKind.SERVER_DIED, f"server {self.label!r} died during the call ({reason})")

    def _on_transport_end(self) -> None:
        # Called by the session's read loop the moment the transport ends (a stdio server's stdout
        # closes when its process dies): fail the in-flight calls now, not when each times out.
        self._withdraw(
            "the server process exited" if self.config.command is not None else "the connection closed"
        )
        self._wake.set()


async def _list_all_tools(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools
