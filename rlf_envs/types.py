"""Value types shared by the env core, the tool backends and the rewards.

Tools: a tool backend (MCP client pool, python functions, ...) turns a :class:`ToolCall` into a
:class:`ToolResult` and never raises for anything the model did or any server failure: every
failure is a result with ``ok=False`` and a specific :class:`ErrorKind`, so one bad call can
never lose another env's result.

Episodes: a :class:`TaskInstance` is one question with its gold answer; an :class:`Episode` is a
finished (or truncated) episode as a reward function sees it. Both live here, below the env core
and the rewards, so that neither has to import the other.

Example:
    >>> call = ToolCall(name="search", arguments={"query": "capital of Zorvia"})
    >>> ToolResult.failure(call, ErrorKind.UNKNOWN_TOOL, "no tool named 'search'").ok
    False
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

_call_ids = itertools.count()


class ErrorKind(enum.StrEnum):
    """Why a tool call did not produce a normal result. The values appear in ``info``."""

    BAD_JSON = "bad_json"  # the tool-call block is not valid JSON
    BAD_FORMAT = "bad_format"  # valid JSON but not {"name": str, "arguments": object}
    UNKNOWN_TOOL = "unknown_tool"  # no tool of that name
    BAD_ARGUMENTS = "bad_arguments"  # arguments fail the tool's input schema / signature
    TIMEOUT = "timeout"  # the call exceeded its per-call timeout
    TOOL_ERROR = "tool_error"  # the tool ran and reported an error (MCP isError, python exception)
    SERVER_DIED = "server_died"  # the server process/connection died while the call was in flight
    SERVER_UNAVAILABLE = "server_unavailable"  # the server could not be (re)started or reached
    TOO_MANY_CALLS = "too_many_calls"  # more calls in one turn than the env allows


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call. ``id`` is unique in the process and links a result to its call."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{next(_call_ids)}")

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI/HF chat-template ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced, or why it failed. ``text`` is what the model will read."""

    call: ToolCall
    text: str
    ok: bool
    error_kind: ErrorKind | None = None
    latency_s: float = 0.0
    truncated: bool = False
    structured: Any = None
    cached: bool = False

    @classmethod
    def failure(cls, call: ToolCall, kind: ErrorKind, message: str, latency_s: float = 0.0) -> ToolResult:
        return cls(
            call=call, text=f"Error ({kind.value}): {message}", ok=False, error_kind=kind, latency_s=latency_s
        )

    def record(self) -> dict[str, Any]:
        """A JSON-friendly record for ``info["tool_calls"]``."""
        return {
            "id": self.call.id,
            "name": self.call.name,
            "arguments": self.call.arguments,
            "ok": self.ok,
            "error": self.error_kind.value if self.error_kind else None,
            "latency_s": round(self.latency_s, 6),
            "truncated": self.truncated,
            "cached": self.cached,
        }


@dataclass(frozen=True)
class ToolSpec:
    """A tool's name, description and JSON-schema parameters (OpenAI function format)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@runtime_checkable
class ToolProvider(Protocol):
    """A source of tools. All methods run on the env's event loop; ``call`` never raises."""

    async def start(self) -> None: ...

    def specs(self) -> list[ToolSpec]: ...

    async def call(self, call: ToolCall) -> ToolResult: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class TaskInstance:
    """One question with its gold answer (any value the task's reward understands)."""

    id: str
    question: str
    answer: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """A finished (or truncated) episode, as reward functions see it: ``instance`` is its question."""

    instance: TaskInstance
    messages: list[dict[str, Any]]
    final_response: str
    final_answer: str | None
    tool_calls: list[dict[str, Any]]
    turns: int
    terminated: bool
    truncated: bool
    # Dialogue episodes (a user simulator): user turns played, the simulator flag if any, and the
    # per-episode hidden tool arguments the task opened (e.g. the episode's own database).
    user_turns: int = 0
    sim_error: str | None = None
    episode_args: dict[str, Any] = field(default_factory=dict)


RewardValue = float | dict[str, Any]
RewardFn = Callable[[Episode], RewardValue | Awaitable[RewardValue]]
