"""What went wrong with an MCP server or a call into one, as an :class:`ErrorKind` and a message.

A replica never lets an exception out of a call: :func:`classify_call_exception` turns what a call
raised into a :class:`CallFailure`, :func:`deadline_failure` explains a call whose own timeout
fired, and :func:`describe_exception` writes the one-line reasons both use.
:class:`MCPServerStartError` is the one error the pool does raise, from ``start()``.

Example:
    >>> describe_exception(ExceptionGroup("task group", [OSError("pipe closed"), TimeoutError()]))
    'OSError: pipe closed; timed out'
    >>> failure = classify_call_exception(BrokenPipeError("gone"), "search", stopping=False)
    >>> failure.kind.value, failure.connection_failed
    ('server_died', True)
    >>> deadline_failure("sleep", 2.0, "search", sent=True, ready=True).message
    "'sleep' timed out after 2 s"
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import anyio
import httpx2
import mcp_types
import pydantic
from mcp.shared.exceptions import MCPError

from rlf_envs.types import ErrorKind

__all__ = [
    "CallFailure",
    "MCPServerStartError",
    "classify_call_exception",
    "deadline_failure",
    "describe_exception",
]

logger = logging.getLogger(__name__)


class MCPServerStartError(RuntimeError):
    """Servers that failed their initial start. ``failures`` maps server name to the reason."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = dict(failures)
        details = "\n".join(f"  {name}: {reason}" for name, reason in failures.items())
        super().__init__(f"{len(failures)} MCP server(s) failed to start:\n{details}")


@dataclass(frozen=True)
class CallFailure:
    """Why one call failed: the ``error_kind`` and text of its :class:`~rlf_envs.types.ToolResult`.

    ``connection_failed``: the exception says the connection itself may be gone, so the replica
    has it checked (a ``tools/list`` request) and restarted if it does not answer.
    """

    kind: ErrorKind
    message: str
    connection_failed: bool = False


def classify_call_exception(exc: Exception, label: str, *, stopping: bool) -> CallFailure:
    """The failure a call into server ``label`` ended with; call it from the ``except`` block.

    ``stopping``: the pool is closing, so whatever broke, the server is simply unavailable now.
    An exception of no known kind is logged with its traceback and reported as a tool error.
    """
    if stopping:
        return CallFailure(
            ErrorKind.SERVER_UNAVAILABLE, f"server {label!r} was stopped (the tool pool was closed)"
        )
    if isinstance(exc, MCPError):
        return _mcp_error_failure(exc, label)
    if isinstance(
        exc,
        OSError
        | TimeoutError
        | httpx2.TransportError
        | anyio.BrokenResourceError
        | anyio.ClosedResourceError,
    ):
        message = f"server {label!r} connection failed: {describe_exception(exc)}"
        return CallFailure(ErrorKind.SERVER_DIED, message, connection_failed=True)
    if isinstance(exc, RuntimeError | pydantic.ValidationError):
        # The SDK's own checks of the result: output schema mismatch, malformed or unexpected result.
        message = f"the server returned an invalid result: {describe_exception(exc)}"
        return CallFailure(ErrorKind.TOOL_ERROR, message)
    logger.exception("MCP call on %r failed", label)
    return CallFailure(ErrorKind.TOOL_ERROR, describe_exception(exc))


def _mcp_error_failure(exc: MCPError, label: str) -> CallFailure:
    """A JSON-RPC error answer, or the SDK failing a pending request because the session ended."""
    if exc.code == mcp_types.CONNECTION_CLOSED or exc.message == "Session terminated":
        message = f"server {label!r} connection lost during the call ({exc.message})"
        return CallFailure(ErrorKind.SERVER_DIED, message, connection_failed=True)
    if exc.code == mcp_types.REQUEST_TIMEOUT:
        return CallFailure(ErrorKind.TIMEOUT, exc.message)
    if exc.code == mcp_types.INVALID_PARAMS:
        return CallFailure(ErrorKind.BAD_ARGUMENTS, exc.message)
    return CallFailure(ErrorKind.TOOL_ERROR, f"{exc.message} (MCP error {exc.code})")


def deadline_failure(call_name: str, timeout_s: float, label: str, *, sent: bool, ready: bool) -> CallFailure:
    """Why a call's own ``timeout_s`` ran out on server ``label``.

    ``sent``: the request had gone to the server (it was too slow). Otherwise the call never got
    to send: with ``ready`` (the replica has a session) it waited for a ``max_concurrency`` slot,
    without it for the server to come up.
    """
    limit = f"{timeout_s:g} s"
    if sent:
        return CallFailure(ErrorKind.TIMEOUT, f"{call_name!r} timed out after {limit}")
    if ready:
        return CallFailure(
            ErrorKind.TIMEOUT, f"{call_name!r} waited {limit} for a free slot (max_concurrency)"
        )
    return CallFailure(
        ErrorKind.SERVER_UNAVAILABLE, f"server {label!r} did not come up within the call's {limit} timeout"
    )


def describe_exception(exc: BaseException) -> str:
    """A one-line reason; exception groups (anyio task groups) are flattened to their leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe_exception(inner) for inner in exc.exceptions)
    if isinstance(exc, MCPError) and exc.code == mcp_types.CONNECTION_CLOSED:
        return f"connection closed ({exc.message})"
    if isinstance(exc, TimeoutError) and not str(exc):
        return "timed out"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
