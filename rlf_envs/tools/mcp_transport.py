"""The streams of one MCP connection: a stdio server process or a streamable-HTTP session.

:func:`open_transport` spawns the process (or opens the HTTP client) and yields the read and write
streams an ``mcp.Client`` runs on. The read stream is a :class:`WatchedReadStream`, which reports
the moment the transport ends (a stdio server's stdout closes when its process dies), so the
replica can fail its in-flight calls at once instead of when each times out. A stdio server's
stderr goes through a :class:`StderrTail`: forwarded to debug logging, its last lines kept to
explain a server that fails to start. Over HTTP, :func:`track_delivery` tells whether a call's
request may have reached the server: a call whose request never began to go out (the connection
was refused, or the session died first) is safe to send to another replica.

Example:
    >>> import asyncio
    >>> async def demo():
    ...     tail = StderrTail("demo")
    ...     await tail.start()
    ...     tail.data_received(b"loading index\\nno index at /nowhere\\n")
    ...     lines = await tail.final_tail(wait_s=0.1)
    ...     tail.close()
    ...     return lines
    >>> print(asyncio.run(demo()))
    loading index
    no index at /nowhere
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from mcp import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from rlf_envs.tools.mcp_config import MCPServerConfig

__all__ = [
    "STDERR_TAIL_LINES",
    "RequestDelivery",
    "StderrTail",
    "WatchedReadStream",
    "open_transport",
    "track_delivery",
]

logger = logging.getLogger(__name__)

STDERR_TAIL_LINES = 20


@asynccontextmanager
async def open_transport(
    config: MCPServerConfig, stderr: StderrTail | None, *, call_timeout_s: float, on_end: Callable[[], None]
) -> AsyncIterator[Any]:
    """The transport's ``(read, write)`` streams, the read side watched: ``on_end`` runs when it ends.

    ``stderr`` is required for a stdio server (``config.command``) and unused over HTTP;
    ``call_timeout_s`` is the server's per-call timeout, which bounds the HTTP read timeout from below.
    """
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
            yield WatchedReadStream(read, on_end=on_end), write
    else:
        assert config.url is not None
        # Unbounded connections: every in-flight call holds one POST (its SSE response) open.
        limits = httpx2.Limits(max_connections=None, max_keepalive_connections=64)
        timeout = httpx2.Timeout(10.0, read=max(300.0, call_timeout_s + 60.0))
        http = httpx2.AsyncClient(
            headers=dict(config.headers),
            timeout=timeout,
            limits=limits,
            event_hooks={"request": [_trace_delivery]},
        )
        async with http, streamable_http_client(config.url, http_client=http) as (read, write):
            yield WatchedReadStream(read, on_end=on_end), write


@dataclass
class RequestDelivery:
    """Whether any HTTP request of one call may have reached the server.

    ``sent`` turns True when httpcore begins writing a request's headers: from then on the server
    may run the call, whatever happens next. A request refused at connect never gets that far.
    """

    sent: bool = False

    async def trace(self, event: str, info: Any) -> None:
        # httpcore's "trace" extension: "http11.send_request_headers.started", "connect_tcp.failed", ...
        if event.endswith("send_request_headers.started"):
            self.sent = True


_CALL_DELIVERY: ContextVar[RequestDelivery | None] = ContextVar("rlf_mcp_call_delivery", default=None)


@contextmanager
def track_delivery() -> Iterator[RequestDelivery]:
    """Record whether the HTTP requests made inside the block (in this task) may have been delivered.

    The MCP SDK sends each request from a task that copies the sender's context, so the request
    hook of :func:`open_transport`'s client sees this block's record.

    Example:
        >>> with track_delivery() as delivery:
        ...     pass
        >>> delivery.sent
        False
    """
    delivery = RequestDelivery()
    token = _CALL_DELIVERY.set(delivery)
    try:
        yield delivery
    finally:
        _CALL_DELIVERY.reset(token)


async def _trace_delivery(request: httpx2.Request) -> None:
    delivery = _CALL_DELIVERY.get()
    if delivery is not None:
        request.extensions["trace"] = delivery.trace


class WatchedReadStream:
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

    def __aiter__(self) -> WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> WatchedReadStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class StderrTail(asyncio.Protocol):
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
