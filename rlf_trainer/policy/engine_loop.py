"""EngineLoop: per-request async generation on an in-process vLLM ``LLMEngine``, continuously batched.

Any number of coroutines, on any event loop, ``await loop.generate(prompt_ids, params)``; one
driver thread owns the engine, adds new requests between scheduler steps and resolves each
request's future the moment that request finishes. New requests join the running batch at the
next step (vLLM's scheduler does the continuous batching), so an episode whose tool result came
back early starts its next turn while slower episodes are still waiting on their tools.

Why not ``vllm.v1.engine.async_llm.AsyncLLM``: its engine core always runs in a separate process,
so a colocated trainer would have to serialise every weight sync through it. Driving the
``LLMEngine`` that :class:`~rlf_trainer.policy.vllm.VLLMPolicy` already owns gives the same
scheduler and continuous batching, keeps the engine in the training process (weights are
reloaded by reference, as in the lockstep path) and needs no second copy of the model.

The driver thread also runs anything that must not interleave with a step (weight reloads, the
lockstep ``generate``): :meth:`EngineLoop.exclusive` waits until the engine is idle and holds it.

Example (``engine`` is ``VLLMPolicy(...).llm.llm_engine``)::

    loop = EngineLoop(engine)
    output = await loop.generate(TokensPrompt(prompt_token_ids=[1, 2, 3]), sampling_params)
    loop.close()
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_request_ids = itertools.count()
_WAKE = object()  # put in the inbox when exclusive() ends, so the driver re-checks deferred requests


class EngineLoopClosed(RuntimeError):
    """A request was made after :meth:`EngineLoop.close`, or the driver thread stopped."""


@dataclass
class _Submission:
    request_id: str
    prompt: Any
    params: Any
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


class EngineLoop:
    """Owns an ``LLMEngine`` on one driver thread; ``generate`` is awaitable from any event loop.

    Attributes:
        peak_running: the most requests in the engine at once (continuous batching at work).
        steps: scheduler steps run by the driver.
    """

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # _Submission, _WAKE or None (close)
        self._pending: dict[str, _Submission] = {}
        self._deferred: collections.deque[_Submission] = collections.deque()
        self._idle = threading.Condition()
        self._exclusive_depth = 0
        self._closed = False
        self._error: BaseException | None = None
        self.peak_running = 0
        self.steps = 0
        self._thread = threading.Thread(target=self._drive, name="rlf-engine-loop", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------------- public API
    async def generate(self, prompt: Any, params: Any) -> Any:
        """Add one request (a vLLM prompt and ``SamplingParams``); its final ``RequestOutput``."""
        if self._closed or self._error is not None:
            raise EngineLoopClosed(f"the engine loop is closed ({self._error or 'close() was called'})")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        params = _final_only(params)
        self._inbox.put(_Submission(f"rlf-async-{next(_request_ids)}", prompt, params, loop, future))
        return await future

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the engine while no request is in it: weight reloads, cache resets, a lockstep generate."""
        with self._idle:
            self._exclusive_depth += 1
            # requests submitted meanwhile wait in the inbox (the driver admits none while depth > 0)
            self._idle.wait_for(lambda: not self._pending or self._closed)
        try:
            yield
        finally:
            with self._idle:
                self._exclusive_depth -= 1
                self._idle.notify_all()
            self._inbox.put(_WAKE)  # requests deferred meanwhile may go in now

    def close(self) -> None:
        """Stop the driver thread; requests still in flight fail with :class:`EngineLoopClosed`."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(None)
        with self._idle:
            self._idle.notify_all()
        self._thread.join(timeout=30)

    # ----------------------------------------------------------------------------- the driver
    def _drive(self) -> None:
        try:
            while not self._closed:
                self._admit(block=not self._pending)
                if self._pending:
                    self._step()
            self._fail_all(EngineLoopClosed("the engine loop was closed"))
        except BaseException as exc:  # an engine failure must reach every waiting coroutine
            self._error = exc
            self._fail_all(exc)

    def _admit(self, *, block: bool) -> None:
        """Move submissions into the engine; with ``block``, wait for the first one."""
        while True:
            item = self._next_submission(block)
            if item is None:
                return
            block = False
            with self._idle:
                if self._exclusive_depth > 0:
                    if self._pending:  # a holder waits for these to finish: keep stepping them
                        self._deferred.append(item)
                        return
                    self._idle.wait_for(lambda: self._exclusive_depth == 0 or self._closed)
                    if self._closed:
                        self._deferred.append(item)
                        return
                self._engine.add_request(item.request_id, item.prompt, item.params)
                self._pending[item.request_id] = item
            self.peak_running = max(self.peak_running, len(self._pending))

    def _next_submission(self, block: bool) -> _Submission | None:
        while True:
            if self._deferred and self._exclusive_depth == 0:
                return self._deferred.popleft()
            try:
                item = self._inbox.get(block=block)
            except queue.Empty:
                return None
            if item is None:
                return None
            if item is not _WAKE:
                return item

    def _step(self) -> None:
        outputs = self._engine.step()
        self.steps += 1
        for output in outputs:
            if not output.finished:
                continue
            submission = self._pending.pop(output.request_id, None)
            if submission is not None:
                _resolve(submission, output)
        if not self._pending:
            with self._idle:
                self._idle.notify_all()

    def _fail_all(self, exc: BaseException) -> None:
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Submission):
                self._pending[item.request_id] = item
        for item in self._deferred:
            self._pending[item.request_id] = item
        self._deferred.clear()
        for submission in self._pending.values():
            _resolve(submission, exc)
        self._pending.clear()
        with self._idle:
            self._idle.notify_all()


def _final_only(params: Any) -> Any:
    # only the finished output matters: no per-token outputs crossing back to the driver
    from vllm.sampling_params import RequestOutputKind

    params.output_kind = RequestOutputKind.FINAL_ONLY
    return params


def _resolve(submission: _Submission, result: Any) -> None:
    def settle() -> None:
        if submission.future.done():
            return
        if isinstance(result, BaseException):
            submission.future.set_exception(result)
        else:
            submission.future.set_result(result)

    with contextlib.suppress(RuntimeError):  # the caller's loop may already be closed
        submission.loop.call_soon_threadsafe(settle)
