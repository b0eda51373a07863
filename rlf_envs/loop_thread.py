"""A persistent asyncio event loop on a background thread, owned by an env.

Gymnasium's API is synchronous, but tool sessions (MCP clients) are async and must live on one
loop for their whole life. Each env owns one :class:`LoopThread`; the sync API submits coroutines
to it and waits, and the async API awaits them from whatever loop the caller runs.

Example:
    >>> import asyncio
    >>> loop = LoopThread("demo")
    >>> loop.run(asyncio.sleep(0, result=42))
    42
    >>> loop.close()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_CLOSE_TIMEOUT_S = 10.0


class LoopThread:
    """An event loop running forever on a daemon thread until :meth:`close`."""

    def __init__(self, name: str = "rlf-env-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and block the calling thread until it finishes."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run() called from its own loop: await the coroutine instead")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop from any loop (directly when already on it)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        """Cancel what is still pending, stop the loop and join the thread. Idempotent.

        The clean-up runs on the loop's own thread, so closing works from a thread that is itself
        running an event loop (a notebook, an async app, Playwright's sync API).
        """
        if self.loop.is_closed():
            return
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.close() called from its own loop: close it from another thread")
        if self._thread.is_alive():
            drained = asyncio.run_coroutine_threadsafe(_drain(), self.loop)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                drained.result(timeout=_CLOSE_TIMEOUT_S)  # a task that ignores cancellation is left behind
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=_CLOSE_TIMEOUT_S)
        else:  # the loop thread died: drain on a helper thread, which runs no loop of its own
            helper = threading.Thread(target=lambda: self.loop.run_until_complete(_drain()), daemon=True)
            helper.start()
            helper.join(timeout=_CLOSE_TIMEOUT_S)
        if not self.loop.is_running():
            self.loop.close()


async def _drain() -> None:
    """Cancel every other task of the running loop, wait for them, then close its async generators."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current and not task.done()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()
