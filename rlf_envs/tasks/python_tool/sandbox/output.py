"""Reads a child's stdout and stderr in chunks under one shared character budget.

The server never holds more than the budget plus one chunk per stream: once the budget is spent
the overflow callback runs (the runner kills the process group) and later chunks are dropped
as they arrive, so a program printing gigabytes costs the server nothing but the reads.

Example:
    >>> import asyncio
    >>> async def demo():
    ...     stream = asyncio.StreamReader(); stream.feed_data(b"abcdef"); stream.feed_eof()
    ...     output = CappedOutput(limit_chars=4)
    ...     await output.pump(stream, "stdout")
    ...     return output.text("stdout"), output.truncated
    >>> asyncio.run(demo())
    ('abcd', True)
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Callable

CHUNK_BYTES = 64 * 1024


class CappedOutput:
    """The kept text of named streams (``"stdout"``, ``"stderr"``), at most ``limit_chars`` in all."""

    def __init__(self, limit_chars: int, on_overflow: Callable[[], None] | None = None) -> None:
        self.limit_chars = limit_chars
        self.truncated = False
        self._on_overflow = on_overflow
        self._parts: dict[str, list[str]] = {}
        self._used = 0

    def text(self, name: str) -> str:
        return "".join(self._parts.get(name, ()))

    async def pump(self, stream: asyncio.StreamReader, name: str) -> None:
        """Read ``stream`` to EOF, keeping what fits in the budget."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts.setdefault(name, [])
        while chunk := await stream.read(CHUNK_BYTES):
            if not self.truncated:
                self._keep(name, decoder.decode(chunk))
        if not self.truncated:
            self._keep(name, decoder.decode(b"", final=True))

    def _keep(self, name: str, text: str) -> None:
        room = self.limit_chars - self._used
        if len(text) > room:
            text = text[:room]
            self.truncated = True
        self._parts[name].append(text)
        self._used += len(text)
        if self.truncated and self._on_overflow is not None:
            self._on_overflow()
