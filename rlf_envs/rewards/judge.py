"""LLM-as-judge reward: ask an OpenAI-compatible chat endpoint whether an episode's answer is right.

:class:`JudgeReward` is an async callable on an :class:`~rlf_envs.tasks.base.Episode`, so it drops
into any task as its reward (``gym.make("RLF/ToolUse-v0", reward=JudgeReward(...))``) and the
env scores every finished episode of a batch concurrently. It never raises: when the judge
cannot be reached (after retries with exponential backoff), answers with an HTTP error, or
replies without a score, the episode gets the declared ``fallback_score`` and
``judge_fallback: True`` with the reason in ``judge_error``.

:class:`OpenAIChatClient` is the HTTP client underneath (also used by the agent MCP server,
``rlf_envs.servers.agent``): one aiohttp session per event loop, created on the loop that first
uses it and closed by :meth:`OpenAIChatClient.aclose` (or automatically when that loop shuts down
its async generators, as ``asyncio.run`` and the envs' loops do), a semaphore bounding the
requests in flight, and retries on connection errors, timeouts, HTTP 429 and 5xx.

Example:
    >>> judge = JudgeReward("http://127.0.0.1:8000/v1", "qwen3-8b", max_concurrency=32)   # doctest: +SKIP
    >>> envs = gym.make_vec("RLF/ToolUse-v0", num_envs=64, tasks="qa.jsonl", reward=judge)  # doctest: +SKIP
    >>> parse_score_tag("The answer names the right city. <score>1</score>")
    1.0
    >>> parse_yes_no("No, the reference says 1749.")
    0.0
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rlf_envs.rewards.rules import episode_prediction
from rlf_envs.tasks.base import Episode

ScoreParser = Callable[[str], float | None]

# --------------------------------------------------------------------------------------------------
# Score parsers
# --------------------------------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_SCORE_TAG = re.compile(r"<score>\s*(.*?)\s*</score>", re.DOTALL | re.IGNORECASE)
_LEADING_VERDICT = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def _without_thinking(text: str) -> str:
    """The reply without ``<think>`` blocks: a reasoning judge may try out scores while it thinks."""
    return _THINK.sub("", text)


def parse_score_tag(text: str) -> float | None:
    """The number in the last ``<score>...</score>`` block, or None when there is none in [0, 1].

    Example:
        >>> parse_score_tag("<think><score>0</score>?</think> Right. <score> 0.75 </score>")
        0.75
        >>> parse_score_tag("<score>7</score>") is None, parse_score_tag("score: 1") is None
        (True, True)
    """
    matches = _SCORE_TAG.findall(_without_thinking(text))
    if not matches:
        return None
    try:
        value = float(matches[-1])
    except ValueError:
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def parse_yes_no(text: str) -> float | None:
    """1.0 for a "yes" verdict, 0.0 for "no", None for neither.

    A reply that starts with yes/no is that verdict; otherwise the last standalone yes/no word
    counts (judges tend to reason first and conclude last).

    Example:
        >>> parse_yes_no("Yes."), parse_yes_no("The dates differ, so the answer is: no"), parse_yes_no("maybe")
        (1.0, 0.0, None)
    """
    text = _without_thinking(text).strip()
    verdict = _LEADING_VERDICT.match(text)
    if verdict is None:
        words = _VERDICT.findall(text)
        if not words:
            return None
        word = words[-1]
    else:
        word = verdict.group(1)
    return 1.0 if word.lower() == "yes" else 0.0


SCORE_PARSERS: dict[str, ScoreParser] = {"score_tag": parse_score_tag, "yes_no": parse_yes_no}

# --------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------

_PROMPT_HEAD = """\
You are grading the answer to a question.

Question: {question}
Reference answer(s): {gold}
Candidate answer: {answer}

Decide whether the candidate answer is correct. A reference answer, when given, is correct; \
accept any candidate that means the same (other wording, capitalisation, punctuation, an alias, \
extra words that do not change the answer). Without a reference, judge from your own knowledge.
"""

SCORE_TAG_PROMPT = _PROMPT_HEAD + (
    "Reply with a score from 0 (wrong) to 1 (fully correct) inside <score></score> tags, "
    "for example <score>1</score>."
)
YES_NO_PROMPT = _PROMPT_HEAD + "Is the candidate answer correct? Reply with yes or no."
NO_REFERENCE = "(none given)"
PROMPT_FIELDS = ("question", "gold", "answer")


def render_prompt(template: str, *, question: str, answer: str, golds: Sequence[str]) -> str:
    """Fill a judge template's ``{question}``, ``{gold}`` (golds joined by " | ") and ``{answer}``.

    Example:
        >>> render_prompt("{question} / {gold} / {answer}", question="Q?", answer="a", golds=["x", "y"])
        'Q? / x | y / a'
    """
    gold = " | ".join(golds) if golds else NO_REFERENCE
    return template.format_map({"question": question, "gold": gold, "answer": answer})


def _check_template(template: str) -> None:
    try:
        render_prompt(template, question="q", answer="a", golds=["g"])
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"prompt_template may only use the fields {{question}}, {{gold}} and {{answer}} "
            f"(double other braces: {{{{ }}}}): {type(exc).__name__}: {exc}"
        ) from None


# --------------------------------------------------------------------------------------------------
# OpenAI-compatible chat client
# --------------------------------------------------------------------------------------------------


class ChatErrorKind(enum.StrEnum):
    """Why a chat completion (or a judge verdict) did not come back."""

    UNAVAILABLE = "unavailable"  # connection failed/reset, timeout, HTTP 429/5xx, on every attempt
    BAD_RESPONSE = "bad_response"  # HTTP 4xx, or a body that is not a chat completion
    UNPARSABLE = "unparsable"  # (judge) the reply holds no score the parser understands


class ChatCompletionError(Exception):
    """A chat completion failed; ``kind`` says how, ``attempts`` how many requests were made."""

    def __init__(
        self, kind: ChatErrorKind, message: str, *, attempts: int, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.attempts = attempts
        self.status = status


class _RetryableError(Exception):
    """An attempt that may succeed if repeated (connection trouble, timeout, 429, 5xx)."""


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
        >>> client = OpenAIChatClient("http://127.0.0.1:8000/v1", "tiny")                 # doctest: +SKIP
        >>> (await client.complete([{"role": "user", "content": "Hi"}], max_tokens=8)).text  # doctest: +SKIP
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
        last_error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                async with client.limiter:  # the backoff sleep above holds no slot
                    self.stats.attempts += 1
                    completion = await self._attempt(client.session, payload, attempt + 1)
            except _RetryableError as exc:
                last_error = str(exc)
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
            raise _RetryableError(f"no reply within {self.timeout_s:g} s") from None
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


# --------------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeVerdict:
    """One judgement. ``score`` is None when the judge gave none (then ``fallback`` is True)."""

    score: float | None
    raw: str
    fallback: bool
    error: str | None = None
    error_kind: ChatErrorKind | None = None

    def reward_info(self, fallback_score: float) -> dict[str, Any]:
        """The reward dict an env puts in ``info["reward_info"]``."""
        return {
            "reward": fallback_score if self.fallback or self.score is None else self.score,
            "judge_score": self.score,
            "judge_raw": self.raw,
            "judge_fallback": self.fallback,
            "judge_error": self.error,
            "judge_error_kind": self.error_kind.value if self.error_kind else None,
        }


def _golds(answer: Any) -> list[str]:
    if answer is None:
        return []
    if isinstance(answer, str):
        return [answer]
    try:
        return [str(a) for a in answer]
    except TypeError:
        return [str(answer)]


class JudgeReward:
    """Reward = an LLM judge's score of the episode's final answer against the gold answer(s).

    Args:
        base_url: the judge's OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8000/v1``
            (``rlf-serve``, vLLM, or any hosted API).
        model: the judge model's name on that server.
        prompt_template: the user message, with ``{question}``, ``{gold}`` and ``{answer}``;
            default :data:`SCORE_TAG_PROMPT` (or :data:`YES_NO_PROMPT` for ``score_parser="yes_no"``).
        score_parser: ``"score_tag"`` (``<score>x</score>``, x in [0, 1]), ``"yes_no"``, or a
            callable ``str -> float | None`` (None: no score in the reply).
        max_concurrency: judge requests in flight at once (per event loop).
        timeout_s, retries, backoff_s, api_key: see :class:`OpenAIChatClient`.
        fallback_score: the reward when no verdict comes back (``judge_fallback: True``).
        max_tokens, temperature: sampling of the judge's reply.
        system_prompt: an optional system message before the prompt.
        answer_tag: the tag the episode's answer is in (the final response is used as the answer
            when a terminated episode has no such tag).

    Returns (awaited on an episode) ``{"reward", "judge_score", "judge_raw", "judge_fallback",
    "judge_error", "judge_error_kind"}``. An episode with no answer at all (truncated without
    one) is scored 0.0 without asking the judge.

    Example:
        >>> judge = JudgeReward("http://127.0.0.1:8000/v1", "judge", score_parser="yes_no")  # doctest: +SKIP
        >>> await judge(episode)                                                          # doctest: +SKIP
        {'reward': 1.0, 'judge_score': 1.0, 'judge_raw': 'Yes.', 'judge_fallback': False, ...}
        >>> await judge.aclose()                                                          # doctest: +SKIP
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        prompt_template: str | None = None,
        score_parser: str | ScoreParser = "score_tag",
        max_concurrency: int = 16,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        fallback_score: float = 0.0,
        api_key: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        system_prompt: str | None = None,
        answer_tag: str = "answer",
    ) -> None:
        if isinstance(score_parser, str):
            if score_parser not in SCORE_PARSERS:
                raise ValueError(f"unknown score_parser {score_parser!r}; use one of {sorted(SCORE_PARSERS)} or a callable")  # fmt: skip
            self.score_parser: ScoreParser = SCORE_PARSERS[score_parser]
        elif callable(score_parser):
            self.score_parser = score_parser
        else:
            raise TypeError(f"score_parser must be a name or a callable, got {type(score_parser).__name__}")
        if prompt_template is None:
            prompt_template = YES_NO_PROMPT if score_parser == "yes_no" else SCORE_TAG_PROMPT
        _check_template(prompt_template)
        self.prompt_template = prompt_template
        self.fallback_score = float(fallback_score)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.answer_tag = answer_tag
        self.client = OpenAIChatClient(
            base_url, model, max_concurrency=max_concurrency, timeout_s=timeout_s, retries=retries,
            backoff_s=backoff_s, api_key=api_key,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"JudgeReward({self.client.base_url!r}, {self.client.model!r})"

    async def __call__(self, episode: Episode) -> dict[str, Any]:
        """Score one finished episode (the reward function a task calls)."""
        answer = episode_prediction(episode, self.answer_tag)
        if answer is None and episode.terminated:
            answer = episode.final_response.strip()  # answered in plain text, without the tag
        if not answer:
            return JudgeVerdict(0.0, "", fallback=False).reward_info(self.fallback_score)
        verdict = await self.judge(episode.task.question, answer, _golds(episode.task.answer))
        return verdict.reward_info(self.fallback_score)

    async def judge(self, question: str, answer: str, golds: Sequence[str] = ()) -> JudgeVerdict:
        """Ask the judge about one answer; never raises (failures are fallback verdicts)."""
        prompt = render_prompt(self.prompt_template, question=question, answer=answer, golds=golds)
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        try:
            completion = await self.client.complete(
                messages, max_tokens=self.max_tokens, temperature=self.temperature
            )
        except ChatCompletionError as exc:
            return JudgeVerdict(
                None, "", fallback=True, error=f"{exc.kind.value}: {exc}", error_kind=exc.kind
            )
        except Exception as exc:  # anything unforeseen still must not lose the batch
            return JudgeVerdict(None, "", fallback=True, error=f"{type(exc).__name__}: {exc}",
                                error_kind=ChatErrorKind.UNAVAILABLE)  # fmt: skip
        try:
            score = self.score_parser(completion.text)
            score = None if score is None else float(score)
        except Exception as exc:  # a user parser's bug is reported like an unparsable reply
            return JudgeVerdict(None, completion.text, fallback=True, error_kind=ChatErrorKind.UNPARSABLE,
                                error=f"unparsable: the score parser raised {type(exc).__name__}: {exc}")  # fmt: skip
        if score is None or math.isnan(score):
            return JudgeVerdict(None, completion.text, fallback=True, error_kind=ChatErrorKind.UNPARSABLE,
                                error=f"unparsable: no score in the judge's reply {completion.text[:200]!r}")  # fmt: skip
        return JudgeVerdict(score, completion.text, fallback=False)

    async def aclose(self) -> None:
        """Close the HTTP sessions (see :meth:`OpenAIChatClient.aclose`)."""
        await self.client.aclose()

    def close(self) -> None:
        """Close the HTTP sessions from synchronous code (see :meth:`OpenAIChatClient.close`)."""
        self.client.close()


__all__ = [
    "NO_REFERENCE",
    "SCORE_PARSERS",
    "SCORE_TAG_PROMPT",
    "YES_NO_PROMPT",
    "ChatCompletion",
    "ChatCompletionError",
    "ChatErrorKind",
    "JudgeReward",
    "JudgeVerdict",
    "OpenAIChatClient",
    "chat_completions_url",
    "parse_score_tag",
    "parse_yes_no",
    "render_prompt",
]
