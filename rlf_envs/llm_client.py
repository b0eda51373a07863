"""An OpenAI-compatible chat client: the one HTTP client of the env half.

The LLM judge (:mod:`rlf_envs.rewards.judge`), the agent MCP server (``rlf_envs.servers.agent``)
and the user simulator all talk to models through :class:`OpenAIChatClient`: one aiohttp session
per event loop, created on the loop that first uses it and closed by
:meth:`OpenAIChatClient.aclose` (or automatically when that loop shuts down its async generators,
as ``asyncio.run`` and the envs' loops do), a semaphore bounding the requests in flight, and
retries on connection errors, timeouts, HTTP 429 and 5xx. Failures raise one typed
:class:`ChatCompletionError` whose :class:`ChatErrorKind` says what went wrong.

Example:
    >>> client = OpenAIChatClient("http://127.0.0.1:8000/v1", "smollm2", max_concurrency=8)
    >>> client.url
    'http://127.0.0.1:8000/v1/chat/completions'
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp


class ChatErrorKind(enum.StrEnum):
    """Why a chat completion (or a judge verdict) did not come back."""

    UNAVAILABLE = "unavailable"  # connection failed/reset, timeout, HTTP 429/5xx, on every attempt
    BAD_RESPONSE = "bad_response"  # HTTP 4xx, or a body that is not a chat completion
    UNPARSABLE = "unparsable"  # (judge) the reply holds no score the parser understands


class ChatCompletionError(Exception):
    """A chat completion failed; ``kind`` says how, ``attempts`` how many requests were made.

    ``timed_out``: the last attempt ran out of the client's ``timeout_s`` (an ``unavailable`` error
    that callers with a time limit of their own report as a timeout).
    """

    def __init__(
        self, kind: ChatErrorKind, message: str, *, attempts: int, status: int | None = None,
        timed_out: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts
        self.status = status
        self.timed_out = timed_out


class _RetryableError(Exception):
    """An attempt that may succeed if repeated (connection trouble, timeout, 429, 5xx)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def chat_completions_url(base_url: str) -> str:
    """The chat completions endpoint for an OpenAI-style base URL.

    Example:
        >>> chat_completions_url("http://127.0.0.1:8000/v1"), chat_completions_url("http://h:1")
        ('http://127.0.0.1:8000/v1/chat/completions', 'http://h:1/v1/chat/completions')
    """
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return f"{url}/chat/completions" if url.endswith("/v1") else f"{url}/v1/chat/completions"


@dataclass(frozen=True)
class ChatCompletion:
    """The first choice's text of a completion and how many HTTP attempts it took."""

    text: str
    finish_reason: str | None
    attempts: int
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClientStats:
    """Counters of an :class:`OpenAIChatClient` (all loops together)."""

    completions: int = 0  # requests that returned a completion
    failures: int = 0  # requests that raised ChatCompletionError
    attempts: int = 0  # HTTP requests sent, retries included
    retries: int = 0


@dataclass
class _LoopClient:
    session: aiohttp.ClientSession
    limiter: asyncio.Semaphore
    closer: AsyncIterator[None]


async def _close_when_loop_shuts_down(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    # An async generator suspended on the loop is closed by loop.shutdown_asyncgens(), which
    # asyncio.run() and the envs' loop threads call before closing the loop: the one hook asyncio
    # offers to close a session on the loop that owns it even if nobody calls aclose().
    try:
        yield
    finally:
        await session.close()


class OpenAIChatClient:
    """Calls ``POST {base_url}/chat/completions`` with retries, usable from any number of event loops.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (see :func:`chat_completions_url`).
        model: the ``model`` field of each request.
        max_concurrency: requests in flight at once, per event loop.
        timeout_s: total time allowed for one HTTP attempt.
        retries: further attempts after a connection error, timeout, HTTP 429 or 5xx.
        backoff_s: wait before retry k (k = 0, 1, ...) is ``backoff_s * 2**k``.
        api_key: sent as ``Authorization: Bearer ...`` when given.

    Example:
        >>> import asyncio
        >>> client = OpenAIChatClient("http://127.0.0.1:8000/v1", "tiny", retries=1)  # no request yet
        >>> client.url, client.open_sessions
        ('http://127.0.0.1:8000/v1/chat/completions', 0)
        >>> asyncio.run(client.complete([{"role": "user", "content": "Hi"}], max_tokens=8)).text  # doctest: +SKIP
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        max_concurrency: int = 16,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        api_key: str | None = None,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if retries < 0 or backoff_s < 0 or timeout_s <= 0:
            raise ValueError("retries and backoff_s must be >= 0 and timeout_s > 0")
        self.base_url = base_url
        self.url = chat_completions_url(base_url)
        self.model = model
        self.max_concurrency = max_concurrency
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self.backoff_s = float(backoff_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.stats = ClientStats()
        self._clients: dict[asyncio.AbstractEventLoop, _LoopClient] = {}

    # Picklable / deep-copyable: sessions belong to loops and are recreated where used.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_clients"] = {}
        return state

    @property
    def open_sessions(self) -> int:
        """How many event loops hold an open session of this client."""
        return sum(1 for c in self._clients.values() if not c.session.closed)

    async def _client(self) -> _LoopClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is not None and not client.session.closed:
            return client
        for other in [lp for lp in self._clients if lp.is_closed()]:  # loops that ended without aclose()
            del self._clients[other]
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(100, self.max_concurrency)), headers=self._headers
        )
        closer = _close_when_loop_shuts_down(session)
        client = _LoopClient(session, asyncio.Semaphore(self.max_concurrency), closer)
        self._clients[loop] = client
        await anext(closer)  # started on this loop, so this loop's shutdown closes the session
        return client

    async def complete(
        self, messages: list[dict[str, Any]], *, max_tokens: int = 256, temperature: float = 0.0, **extra: Any
    ) -> ChatCompletion:
        """The model's reply to ``messages``; raises :class:`ChatCompletionError` once retries are spent.

        ``extra`` goes into the request body as is (``top_p``, ``stop``, ``seed``, ...).
        """
        payload = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                   "temperature": temperature, "n": 1, **extra}  # fmt: skip
        client = await self._client()
        last_error, timed_out = "", False
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with client.limiter:  # the backoff sleep above holds no slot
                    self.stats.attempts += 1
                    completion = await self._attempt(client.session, payload, attempt + 1)
            except _RetryableError as exc:
                last_error, timed_out = str(exc), exc.timed_out
                continue
            except ChatCompletionError:
                self.stats.failures += 1
                raise
            self.stats.completions += 1
            return completion
        self.stats.failures += 1
        raise ChatCompletionError(
            ChatErrorKind.UNAVAILABLE,
            f"{self.url} failed {self.retries + 1} time(s); last error: {last_error}",
            attempts=self.retries + 1,
            timed_out=timed_out,
        )

    async def _attempt(
        self, session: aiohttp.ClientSession, payload: dict[str, Any], attempt: int
    ) -> ChatCompletion:
        try:
            async with session.post(
                self.url, json=payload, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as response:
                body_text = await response.text()
                status = response.status
        except TimeoutError:
            raise _RetryableError(f"no reply within {self.timeout_s:g} s", timed_out=True) from None
        except aiohttp.ClientError as exc:
            raise _RetryableError(f"{type(exc).__name__}: {exc}") from None
        if status == 429 or status >= 500:
            raise _RetryableError(f"HTTP {status}: {body_text[:300]}")
        if status >= 400:
            raise ChatCompletionError(
                ChatErrorKind.BAD_RESPONSE,
                f"HTTP {status}: {body_text[:500]}",
                attempts=attempt,
                status=status,
            )
        return _parse_completion(body_text, attempt)

    async def aclose(self) -> None:
        """Close every session: on this loop directly, on other running loops through them."""
        running = asyncio.get_running_loop()
        for loop, client in list(self._clients.items()):
            if loop is running:
                await client.session.close()
                await client.closer.aclose()
            elif not loop.is_closed() and loop.is_running():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(client.session.close(), loop))
            self._clients.pop(loop, None)

    def close(self) -> None:
        """Synchronous :meth:`aclose` for code without a loop (sessions on loops of other threads)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running in self._clients:
            raise RuntimeError("close() called on a loop that holds a session: use `await aclose()` there")
        for loop, client in list(self._clients.items()):
            if not loop.is_closed() and loop.is_running():
                asyncio.run_coroutine_threadsafe(client.session.close(), loop).result(timeout=10)
            self._clients.pop(loop, None)


def _parse_completion(body_text: str, attempt: int) -> ChatCompletion:
    try:
        body = json.loads(body_text)
        choice = body["choices"][0]
        content = choice["message"].get("content")
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise ChatCompletionError(
            ChatErrorKind.BAD_RESPONSE, f"not a chat completion: {body_text[:300]!r}", attempts=attempt
        ) from None
    if content is not None and not isinstance(content, str):
        raise ChatCompletionError(
            ChatErrorKind.BAD_RESPONSE, f"message content is not text: {content!r:.200}", attempts=attempt
        )
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    return ChatCompletion(content or "", choice.get("finish_reason"), attempt, usage)
