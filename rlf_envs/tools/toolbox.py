"""The tools of an env: MCP servers and python functions behind one name-routed interface.

A :class:`ToolBox` owns its providers, routes each call by tool name, runs a whole batch of calls
concurrently, and applies the env-level rules every backend shares: unknown tools, the per-turn
call limit, and truncation of long results. It never raises for a call.

Example:
    >>> import asyncio
    >>> def shout(text: str) -> str:
    ...     '''Upper-case the text.'''
    ...     return text.upper()
    >>> async def demo():
    ...     box = ToolBox(python_tools=[shout], max_result_chars=100)
    ...     await box.start()
    ...     results = await box.call_many([ToolCall("shout", {"text": "hi"}), ToolCall("nope", {})])
    ...     await box.aclose()
    ...     return [(r.ok, r.text) for r in results]
    >>> asyncio.run(demo())
    [(True, 'HI'), (False, "Error (unknown_tool): no tool named 'nope'; available: shout")]
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rlf_envs.tools.functions import FunctionTools
from rlf_envs.types import ErrorKind, ToolCall, ToolProvider, ToolResult, ToolSpec

TRUNCATION_MARKER = "\n...[truncated {omitted} characters]"


def truncate_text(text: str, max_chars: int | None) -> tuple[str, bool]:
    """Cut ``text`` to at most ``max_chars`` characters, marker included."""
    if max_chars is None or len(text) <= max_chars:
        return text, False
    marker = TRUNCATION_MARKER.format(omitted=len(text) - max_chars)
    keep = max(0, max_chars - len(marker))
    marker = TRUNCATION_MARKER.format(omitted=len(text) - keep)
    return (text[:keep] + marker)[: max(max_chars, len(marker))], True


class ToolBox:
    """Name-routed tools from MCP servers (``mcp_servers`` config) and python functions."""

    def __init__(
        self,
        mcp_servers: dict[str, Any] | str | os.PathLike[str] | None = None,
        python_tools: Sequence[Callable[..., Any]] = (),
        *,
        max_result_chars: int | None = 4000,
        max_calls_per_turn: int | None = 16,
        tool_timeout_s: float = 30.0,
        providers: Sequence[ToolProvider] = (),
    ) -> None:
        self.max_result_chars = max_result_chars
        self.max_calls_per_turn = max_calls_per_turn
        self._providers: list[ToolProvider] = list(providers)
        if mcp_servers:
            from rlf_envs.tools.mcp_pool import MCPToolPool

            self._providers.append(MCPToolPool(mcp_servers, tool_timeout_s=tool_timeout_s))
        if python_tools:
            self._providers.append(FunctionTools(python_tools, tool_timeout_s=tool_timeout_s))
        self._routes: dict[str, ToolProvider] = {}
        self._specs: list[ToolSpec] = []
        self._started = False

    @property
    def providers(self) -> list[ToolProvider]:
        return list(self._providers)

    async def start(self) -> None:
        """Start every provider (spawn servers, list tools) and build the routing table."""
        if self._started:
            return
        started: list[ToolProvider] = []
        try:
            for provider in self._providers:
                await provider.start()
                started.append(provider)
        except BaseException:
            await asyncio.gather(*(p.aclose() for p in started), return_exceptions=True)
            raise
        for provider in self._providers:
            for spec in provider.specs():
                if spec.name in self._routes:
                    raise ValueError(f"two tool providers both offer a tool named {spec.name!r}")
                self._routes[spec.name] = provider
                self._specs.append(spec)
        self._started = True

    def specs(self) -> list[ToolSpec]:
        return list(self._specs)

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools in OpenAI function format, as ``info["tools"]`` and chat templates want them."""
        return [spec.to_openai() for spec in self._specs]

    async def call(self, call: ToolCall) -> ToolResult:
        """Route one call to its provider; the text is not truncated (see :meth:`fit`)."""
        provider = self._routes.get(call.name)
        if provider is None:
            names = ", ".join(sorted(self._routes)) or "none"
            return ToolResult.failure(
                call, ErrorKind.UNKNOWN_TOOL, f"no tool named {call.name!r}; available: {names}"
            )
        try:
            result = await provider.call(call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a provider bug must still not cost the batch
            result = ToolResult.failure(call, ErrorKind.TOOL_ERROR, f"{type(exc).__name__}: {exc}")
        return result

    def fit(self, result: ToolResult) -> ToolResult:
        """The result with its text cut to ``max_result_chars`` (errors included)."""
        text, truncated = truncate_text(result.text, self.max_result_chars)
        return replace(result, text=text, truncated=True) if truncated else result

    async def call_many(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run calls concurrently; results come back in call order. Calls past the limit are refused."""
        limit = len(calls) if self.max_calls_per_turn is None else self.max_calls_per_turn
        allowed, refused = calls[:limit], calls[limit:]
        results = list(await asyncio.gather(*(self.call(c) for c in allowed)))
        results += [
            ToolResult.failure(
                c, ErrorKind.TOO_MANY_CALLS, f"at most {limit} tool calls per turn; this one was not run"
            )
            for c in refused
        ]
        return [self.fit(r) for r in results]

    async def aclose(self) -> None:
        await asyncio.gather(*(p.aclose() for p in self._providers), return_exceptions=True)
        self._started = False
