"""The OpenAI chat-completions wire format of rlf-serve: parse a request, shape a reply, typed errors."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    pass

FinishReason = Literal["stop", "length"]


class RequestError(ValueError):
    """A request the server refuses; becomes an OpenAI-style error response with ``status``."""

    def __init__(
        self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ChatRequest:
    """One validated chat completion request. ``temperature == 0`` means greedy."""

    messages: list[dict[str, Any]]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None

    def sampling_key(self) -> tuple[float, float, int | None]:
        """Requests with equal keys can share one generate call."""
        return (self.temperature, self.top_p, self.seed)


@dataclass(frozen=True)
class ChatReply:
    """What the model answered to one :class:`ChatRequest`."""

    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"'{key}' must be a number, got {value!r}", param=key)
    if not low <= value <= high:
        raise RequestError(f"'{key}' must be between {low} and {high}, got {value}", param=key)
    return float(value)


def _content_text(message: dict[str, Any], index: int) -> str:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):  # OpenAI content parts: only text parts can reach a text model
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise RequestError(
                    f"messages[{index}].content: only text parts are supported, got {part!r:.80}",
                    param="messages",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(
        f"messages[{index}].content must be a string or a list of text parts", param="messages"
    )


def parse_chat_request(
    body: Any, *, default_max_tokens: int = 256, max_tokens_limit: int = 32768
) -> ChatRequest:
    """Validate an OpenAI ``/v1/chat/completions`` body; raises :class:`RequestError` naming the field.

    Example:
        >>> parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).max_tokens
        8
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list of {role, content} objects", param="messages")
    clean: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{i}] needs a string 'role'", param="messages")
        clean.append({**message, "content": _content_text(message, i)})
    if body.get("stream"):
        raise RequestError("streaming is not supported; send stream=false", param="stream")
    n = body.get("n", 1)
    if n != 1:
        raise RequestError(f"only n=1 is supported, got {n!r}", param="n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is None:
        max_tokens = default_max_tokens
    if (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 1 <= max_tokens <= max_tokens_limit
    ):
        raise RequestError(f"'max_tokens' must be an integer in [1, {max_tokens_limit}], got {max_tokens!r}",
                           param="max_tokens")  # fmt: skip
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 16:
        raise RequestError("'stop' must be a non-empty string or a list of up to 16 of them", param="stop")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be an integer, got {seed!r}", param="seed")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise RequestError("'tools' must be a list of function tools", param="tools")
    return ChatRequest(
        messages=clean,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        stop=stops,
        seed=seed,
        tools=tools or None,
    )


def apply_stop_strings(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` cut before the earliest stop string (OpenAI semantics), and whether one was found.

    Example:
        >>> apply_stop_strings("a, b. c.", [".", "c"])
        ('a, b', True)
    """
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
