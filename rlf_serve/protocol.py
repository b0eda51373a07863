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
    check_max_tokens(max_tokens, max_tokens_limit)
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


# ----------------------------------------------------------------------------------------------
# /v1/completions with a token-id prompt (what an RL trainer sends: the exact ids it trains on)
# ----------------------------------------------------------------------------------------------

# Sampling knobs a completions client may send; only their neutral values are served (the model's
# raw distribution is the contract: anything else would change what the logprobs mean).
_NEUTRAL_KNOBS = {
    "repetition_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "min_p": 0.0,
    "min_tokens": 0,
}


@dataclass(frozen=True)
class CompletionRequest:
    """One validated ``/v1/completions`` request whose prompt is a list of token ids.

    ``logprobs``: return the sampled tokens' raw log-probabilities (OpenAI's ``logprobs: 0``);
    ``return_token_ids``: return the generated ids (vLLM's field), as the trainer needs them.
    """

    prompt: tuple[int, ...]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    return_token_ids: bool = False
    tokens_as_ids: bool = False
    skip_special_tokens: bool = True

    def sampling_key(self) -> tuple[Any, ...]:
        """Requests with equal keys can share one generate call."""
        return (self.temperature, self.top_p, self.top_k, self.seed, self.stop_token_ids)


@dataclass(frozen=True)
class CompletionReply:
    """What the model generated for one :class:`CompletionRequest` (ids end with the stop token)."""

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    stop_reason: int | None = None  # the stop token id, when one ended the completion


def _token_ids(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        raise RequestError(f"'{key}' must be a list of token ids (integers >= 0)", param=key)
    return tuple(value)


def parse_completion_request(
    body: Any, *, default_max_tokens: int = 16, max_tokens_limit: int = 32768
) -> CompletionRequest:
    """Validate an OpenAI ``/v1/completions`` body with a token-id prompt; raises :class:`RequestError`.

    Example:
        >>> r = parse_completion_request({"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 0, "seed": 7})
        >>> r.prompt, r.max_tokens, r.logprobs, r.seed
        ((1, 2, 3), 4, True, 7)
        >>> parse_completion_request({"prompt": "hi"})
        Traceback (most recent call last):
        ...
        rlf_serve.protocol.RequestError: 'prompt' must be a list of token ids: this server takes token-id prompts on /v1/completions (use /v1/chat/completions for text)
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list)):
        raise RequestError(
            "'prompt' must be a list of token ids: this server takes token-id prompts on "
            "/v1/completions (use /v1/chat/completions for text)",
            param="prompt",
        )
    ids = _token_ids(prompt, "prompt")
    if not ids:
        raise RequestError("'prompt' must hold at least one token id", param="prompt")
    for key, bad in (("stream", True), ("echo", True), ("ignore_eos", True)):
        if body.get(key) is bad:
            raise RequestError(f"'{key}' is not supported; send {key}=false", param=key)
    n = body.get("n", 1)
    if n != 1:
        raise RequestError(f"only n=1 is supported, got {n!r}", param="n")
    for key, neutral in _NEUTRAL_KNOBS.items():
        if body.get(key) not in (None, neutral):
            raise RequestError(
                f"'{key}' must be {neutral} (the raw distribution), got {body[key]!r}", param=key
            )
    max_tokens = body.get("max_tokens", default_max_tokens)
    check_max_tokens(max_tokens, max_tokens_limit)
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0) or isinstance(logprobs, bool):
        raise RequestError(
            f"'logprobs' must be 0 (the sampled token's) or null: top alternatives are not computed, got {logprobs!r}",
            param="logprobs",
        )
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < -1):
        raise RequestError(f"'top_k' must be an integer >= -1 (0 and -1: off), got {top_k!r}", param="top_k")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError(f"'seed' must be an integer, got {seed!r}", param="seed")
    return CompletionRequest(
        prompt=ids,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
        top_k=max(0, top_k or 0),
        seed=seed,
        stop_token_ids=_token_ids(body.get("stop_token_ids") or [], "stop_token_ids"),
        logprobs=logprobs == 0,
        return_token_ids=bool(body.get("return_token_ids")),
        tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
        skip_special_tokens=body.get("skip_special_tokens", True) is not False,
    )


def check_max_tokens(max_tokens: Any, limit: int) -> None:
    """A request's ``max_tokens``: an integer in ``[1, limit]`` (a bool is not one), else a
    :class:`RequestError` naming the parameter."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= limit:
        raise RequestError(
            f"'max_tokens' must be an integer in [1, {limit}], got {max_tokens!r}", param="max_tokens"
        )
