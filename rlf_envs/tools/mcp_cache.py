"""The per-server LRU cache of MCP tool results (the ``cache`` key of a server's config).

Only ok results are stored. The key is the tool name plus the arguments as canonical JSON (sorted
keys, no spaces), so the same arguments in another key order hit the same entry; a call whose
arguments are not JSON gets no key and is never cached.

Example:
    >>> from rlf_envs.types import ToolCall, ToolResult
    >>> cache = ResultCache(max_entries=1)
    >>> first = ToolCall("echo", {"text": "x", "n": 1})
    >>> cache.put(ResultCache.key(first), ToolResult(first, "x", ok=True))
    >>> cache.get(ResultCache.key(ToolCall("echo", {"n": 1, "text": "x"}))).text
    'x'
    >>> cache.put(ResultCache.key(ToolCall("echo", {})), ToolResult(first, "", ok=True))
    >>> cache.get(ResultCache.key(first)) is None  # the oldest entry went first
    True
"""

from __future__ import annotations

import json
from collections import OrderedDict

from rlf_envs.types import ToolCall, ToolResult

__all__ = ["ResultCache"]


class ResultCache:
    """Ok results keyed on tool name + canonical JSON arguments; the least recently used goes first."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, ToolResult] = OrderedDict()

    @staticmethod
    def key(call: ToolCall) -> str | None:
        """The cache key of ``call``, or None when its arguments are not JSON (it is not cached)."""
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
