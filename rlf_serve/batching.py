"""rlf-serve batching: concurrent requests gathered into one generate call on a worker thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from rlf_serve.backends import AnyReply, AnyRequest, ChatBackend

T = TypeVar("T")

logger = logging.getLogger("rlf_serve")


@dataclass
class ServerStats:
    """Counters reported by ``GET /stats``."""

    requests: int = 0  # completions served
    errors: int = 0  # requests answered with an error (bad request or failed generation)
    in_flight: int = 0  # chat requests received and not answered yet
    peak_in_flight: int = 0
    batches: int = 0  # batches generated
    generate_calls: int = 0  # model calls (a batch mixing sampling settings needs several)
    largest_batch: int = 0
    active_batch: int = 0  # size of the batch generating right now (0 when idle)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    weight_reloads: int = 0  # weights loaded in place (POST /collective_rpc reload_weights)

    def reset(self) -> None:
        """Zero everything except what is happening now (in-flight requests, the active batch)."""
        in_flight, active = self.in_flight, self.active_batch
        for name, value in asdict(ServerStats()).items():
            setattr(self, name, value)
        self.in_flight, self.peak_in_flight, self.active_batch = in_flight, in_flight, active


@dataclass
class _Pending:
    request: AnyRequest
    future: asyncio.Future[AnyReply] = field(repr=False)


class BatchingGenerator:
    """Gathers concurrent requests into batches and generates each batch on a worker thread.

    A batch closes ``batch_wait_s`` after its first request or at ``max_batch`` requests, whichever
    comes first; only one batch generates at a time (one model). :meth:`pause` lets the batch
    that is generating finish and holds the next until :meth:`resume`; :meth:`exclusive` runs a
    function (a weight reload) while no batch generates.

    Example (a backend that echoes the last message; a real one runs a model):
        >>> from rlf_serve.protocol import ChatReply, parse_chat_request
        >>> class Echo:
        ...     def generate(self, requests):
        ...         return [ChatReply(r.messages[-1]["content"], "stop", 1, 1) for r in requests]
        ...     def generate_calls(self, requests):
        ...         return 1
        >>> async def three_at_once(batcher):
        ...     bodies = [{"messages": [{"role": "user", "content": w}]} for w in ("a", "b", "c")]
        ...     return await asyncio.gather(*(batcher.submit(parse_chat_request(b)) for b in bodies))
        >>> batcher = BatchingGenerator(Echo(), max_batch=16, batch_wait_s=0.05)
        >>> [reply.text for reply in asyncio.run(three_at_once(batcher))], batcher.stats.largest_batch
        (['a', 'b', 'c'], 3)
    """

    def __init__(
        self,
        backend: ChatBackend,
        *,
        max_batch: int = 16,
        batch_wait_s: float = 0.01,
        stats: ServerStats | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend = backend
        self.max_batch = max_batch
        self.batch_wait_s = max(0.0, batch_wait_s)
        self.stats = stats if stats is not None else ServerStats()
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._model_lock = asyncio.Lock()  # held while a batch generates or the weights change
        self._resumed = asyncio.Event()
        self._resumed.set()

    @property
    def paused(self) -> bool:
        return not self._resumed.is_set()

    async def pause(self) -> None:
        """Hold new batches until :meth:`resume`; returns once the batch generating now is done."""
        self._resumed.clear()
        async with self._model_lock:
            pass

    def resume(self) -> None:
        self._resumed.set()

    async def exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a worker thread while no batch generates (e.g. a weight reload)."""
        async with self._model_lock:
            return await asyncio.to_thread(fn)

    async def submit(self, request: AnyRequest) -> AnyReply:
        """Queue ``request`` and wait for its reply (generation errors propagate)."""
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="rlf-serve-batcher")
        pending = _Pending(request, asyncio.get_running_loop().create_future())
        await self._queue.put(pending)
        return await pending.future

    async def _collect(self) -> list[_Pending]:
        batch = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_wait_s
        while len(batch) < self.max_batch:
            if not self._queue.empty():  # arrived while the previous batch generated: take at once
                batch.append(self._queue.get_nowait())
                continue
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self._queue.get(), remaining))
            except TimeoutError:
                break
        return [p for p in batch if not p.future.done()]  # a cancelled request (client gone) is skipped

    async def _run(self) -> None:
        while True:
            batch = await self._collect()
            if not batch:
                continue
            await self._resumed.wait()
            async with self._model_lock:
                batch = [p for p in batch if not p.future.done()]  # clients may have left during a pause
                if batch:
                    await self._generate(batch)

    async def _generate(self, batch: list[_Pending]) -> None:
        requests = [p.request for p in batch]
        self.stats.active_batch = len(batch)
        self.stats.batches += 1
        self.stats.generate_calls += self.backend.generate_calls(requests)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        try:
            replies = await asyncio.to_thread(self.backend.generate, requests)
        except Exception as exc:  # a failed generation fails its requests, not the server
            logger.exception("generation failed for a batch of %d", len(batch))
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
        else:
            for pending, reply in zip(batch, replies, strict=True):
                if not pending.future.done():
                    pending.future.set_result(reply)
        finally:
            self.stats.active_batch = 0

    async def aclose(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
