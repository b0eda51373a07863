"""rlf-serve: an OpenAI-compatible chat server over a local model that batches concurrent requests.

Endpoints: ``POST /v1/chat/completions`` (messages, max_tokens / max_completion_tokens, temperature,
top_p, n=1, stop, seed, tools), ``GET /v1/models``, ``GET /health`` and ``GET /stats`` (requests
served, in-flight and peak in-flight requests, batches run, largest batch, the batch generating
now); ``POST /stats/reset`` zeroes the counters. Errors come back in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``.

Concurrent requests are gathered for up to ``--batch-wait-ms`` (or until ``--max-batch``) and
generated in one call on a worker thread, so the event loop keeps accepting while the model runs;
requests that arrive during a generation form the next batch. The port opens only once the model
is loaded, so "accepts connections" means "ready".

Example::

    rlf-serve --model ~/.cache/rlf/models/smollm2-135m --port 8000          # or python -m rlf_trainer.serve
    curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
        -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'

From Python, any OpenAI client works (``base_url="http://127.0.0.1:8000/v1"``), and so do
:class:`rlf_envs.rewards.judge.JudgeReward` and the agent MCP server ``rlf_envs.servers.agent``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from aiohttp import web

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlf_trainer.policy.base import Policy

logger = logging.getLogger("rlf_trainer.serve")

FinishReason = Literal["stop", "length"]


# ----------------------------------------------------------------------------------------------
# Requests and replies
# ----------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------
# Backends: a whole batch of requests in, one reply each out (runs on a worker thread)
# ----------------------------------------------------------------------------------------------


class ChatBackend(Protocol):
    """Generates replies for a batch of requests; called on a worker thread, one batch at a time."""

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatReply]: ...

    def generate_calls(self, requests: Sequence[ChatRequest]) -> int:
        """How many model calls :meth:`generate` will make for ``requests``."""
        ...


class PolicyChatBackend:
    """Chat on top of a :class:`~rlf_trainer.policy.base.Policy` (HF or vLLM).

    Prompts are rendered with the tokenizer's chat template (:func:`rlf_trainer.chat.prompt_ids`,
    ``tools`` included). Requests that share temperature, top_p and seed go to one
    ``policy.generate`` call with the largest ``max_tokens`` among them; each reply is then cut
    to its own ``max_tokens`` and ``stop`` strings (sampling is left to right, so a cut
    continuation is distributed exactly like a shorter one).
    """

    def __init__(self, policy: Policy, tokenizer: PreTrainedTokenizerBase) -> None:
        self.policy = policy
        self.tokenizer = tokenizer

    def generate_calls(self, requests: Sequence[ChatRequest]) -> int:
        return len({r.sampling_key() for r in requests})

    def close(self) -> None:
        """Shut the policy's engine down (vLLM); the server calls it on exit."""
        self.policy.close()

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatReply]:
        from rlf_trainer.chat import prompt_ids
        from rlf_trainer.policy.base import SamplingParams

        prompts = [prompt_ids(self.tokenizer, r.messages, r.tools) for r in requests]
        groups: dict[tuple[float, float, int | None], list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.sampling_key(), []).append(i)
        replies: list[ChatReply | None] = [None] * len(requests)
        for (temperature, top_p, seed), members in groups.items():
            params = SamplingParams(
                max_new_tokens=max(requests[i].max_tokens for i in members),
                temperature=temperature,
                top_p=top_p,
                seed=seed,
            )
            completions = self.policy.generate([prompts[i] for i in members], params)
            for i, completion in zip(members, completions, strict=True):
                replies[i] = self._reply(
                    requests[i], len(prompts[i]), completion.token_ids, completion.finish_reason
                )
        return [r for r in replies if r is not None]

    def _reply(
        self, request: ChatRequest, prompt_len: int, token_ids: list[int], finish: FinishReason
    ) -> ChatReply:
        if len(token_ids) > request.max_tokens:  # generated for a longer request of the same batch
            token_ids, finish = token_ids[: request.max_tokens], "length"
        body = token_ids[:-1] if finish == "stop" else token_ids  # the end-of-turn token is not content
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        text, stopped = apply_stop_strings(text, request.stop)
        return ChatReply(text, "stop" if stopped else finish, prompt_len, len(token_ids))


def load_backend(
    model: str,
    backend: Literal["hf", "vllm"] = "hf",
    *,
    dtype: str = "auto",
    device: str | None = None,
    gpu_memory_utilization: float = 0.8,
) -> PolicyChatBackend:
    """Load ``model`` (a Hugging Face folder or hub id) behind :class:`PolicyChatBackend`.

    ``hf``: transformers on ``device`` (default cuda if available, else cpu); ``dtype`` "auto" is
    bfloat16 on cuda and float32 on cpu. ``vllm``: :class:`~rlf_trainer.policy.vllm.VLLMPolicy`.
    """
    if backend == "vllm":
        from rlf_trainer.policy.vllm import VLLMPolicy

        policy = VLLMPolicy(
            model, gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=False, dtype=dtype
        )
        return PolicyChatBackend(policy, policy.tokenizer)
    if backend != "hf":
        raise ValueError(f"unknown backend {backend!r}; use 'hf' or 'vllm'")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlf_trainer.policy.hf import HFPolicy

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        torch_dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(model)
    hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).to(device)
    hf_model.eval()
    return PolicyChatBackend(HFPolicy(hf_model, tokenizer), tokenizer)


# ----------------------------------------------------------------------------------------------
# Batching
# ----------------------------------------------------------------------------------------------


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

    def reset(self) -> None:
        """Zero everything except what is happening now (in-flight requests, the active batch)."""
        in_flight, active = self.in_flight, self.active_batch
        for name, value in asdict(ServerStats()).items():
            setattr(self, name, value)
        self.in_flight, self.peak_in_flight, self.active_batch = in_flight, in_flight, active


@dataclass
class _Pending:
    request: ChatRequest
    future: asyncio.Future[ChatReply] = field(repr=False)


class BatchingGenerator:
    """Gathers concurrent requests into batches and generates each batch on a worker thread.

    A batch closes ``batch_wait_s`` after its first request or at ``max_batch`` requests, whichever
    comes first; only one batch generates at a time (one model).

    Example:
        >>> batcher = BatchingGenerator(backend, max_batch=16, batch_wait_s=0.01)  # doctest: +SKIP
        >>> reply = await batcher.submit(parse_chat_request(body))                # doctest: +SKIP
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

    async def submit(self, request: ChatRequest) -> ChatReply:
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


# ----------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------

_BATCHER = web.AppKey("batcher", BatchingGenerator)
_STATS = web.AppKey("stats", ServerStats)
_SETTINGS = web.AppKey("settings", dict)


def _error(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


async def _chat_completions(request: web.Request) -> web.Response:
    stats, settings = request.app[_STATS], request.app[_SETTINGS]
    stats.in_flight += 1
    stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
    try:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"the body is not valid JSON: {exc}") from None
        chat = parse_chat_request(body, default_max_tokens=settings["default_max_tokens"])
        model = body.get("model")
        if model is not None and model != settings["model_name"]:
            raise RequestError(
                f"the model {model!r} does not exist; this server serves {settings['model_name']!r}",
                status=404, param="model", code="model_not_found",
            )  # fmt: skip
        try:
            reply = await request.app[_BATCHER].submit(chat)
        except Exception as exc:
            raise RequestError(f"generation failed: {type(exc).__name__}: {exc}", status=500) from exc
    except RequestError as exc:
        stats.errors += 1
        return _error(exc)
    finally:
        stats.in_flight -= 1
    stats.requests += 1
    stats.prompt_tokens += reply.prompt_tokens
    stats.completion_tokens += reply.completion_tokens
    return web.json_response(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": settings["model_name"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.text},
                    "finish_reason": reply.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }
    )


async def _models(request: web.Request) -> web.Response:
    settings = request.app[_SETTINGS]
    model = {
        "id": settings["model_name"],
        "object": "model",
        "created": settings["created"],
        "owned_by": "rlf",
    }
    return web.json_response({"object": "list", "data": [model]})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "model": request.app[_SETTINGS]["model_name"]})


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(asdict(request.app[_STATS]))


async def _reset_stats(request: web.Request) -> web.Response:
    request.app[_STATS].reset()
    return web.json_response(asdict(request.app[_STATS]))


def build_app(
    backend: ChatBackend,
    *,
    model_name: str,
    max_batch: int = 16,
    batch_wait_ms: float = 10.0,
    default_max_tokens: int = 256,
) -> web.Application:
    """The aiohttp application serving ``backend`` (see the module docstring for the endpoints).

    Example:
        >>> app = build_app(load_backend("path/to/model"), model_name="my-model")   # doctest: +SKIP
        >>> web.run_app(app, host="127.0.0.1", port=8000)                          # doctest: +SKIP
    """
    app = web.Application(client_max_size=64 * 1024 * 1024)
    stats = ServerStats()
    batcher = BatchingGenerator(backend, max_batch=max_batch, batch_wait_s=batch_wait_ms / 1000, stats=stats)
    app[_STATS] = stats
    app[_BATCHER] = batcher
    app[_SETTINGS] = {
        "model_name": model_name,
        "default_max_tokens": default_max_tokens,
        "created": int(time.time()),
    }
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/stats", _stats)
    app.router.add_post("/stats/reset", _reset_stats)

    async def stop_batcher(_: web.Application) -> None:
        await batcher.aclose()
        close = getattr(backend, "close", None)  # optional: test backends have nothing to release
        if callable(close):
            close()

    app.on_cleanup.append(stop_batcher)
    return app


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlf-serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model folder (or hub id)")
    parser.add_argument("--served-model-name", default=None, help="name in /v1/models and requests (default: --model as given)")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--backend", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--max-batch", type=int, default=16, help="most requests in one generate call")
    parser.add_argument("--batch-wait-ms", type=float, default=10.0, help="how long a batch waits for more requests")  # fmt: skip
    parser.add_argument(
        "--default-max-tokens", type=int, default=256, help="when a request sets no max_tokens"
    )
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    parser.add_argument(
        "--device", default=None, help="hf backend: cpu, cuda, cuda:1 (default: cuda if available)"
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="vllm backend")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice; 1 suits tiny models on a busy CPU)")  # fmt: skip
    parser.add_argument("--log-level", default="WARNING", help="INFO also logs every HTTP request")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``rlf-serve`` (``python -m rlf_trainer.serve``)."""
    args = _parser().parse_args(argv)
    level = getattr(logging, str(args.log_level).upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.max_batch < 1:
        print("rlf-serve: --max-batch must be >= 1", file=sys.stderr)
        return 2
    if args.backend == "hf" and not Path(args.model).exists() and args.model.startswith((".", "/", "~")):
        print(f"rlf-serve: no model folder at {args.model}", file=sys.stderr)
        return 2
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    # Load before binding the port: a client that can connect can be served.
    backend = load_backend(
        args.model,
        args.backend,
        dtype=args.dtype,
        device=args.device,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )
    name = args.served_model_name or args.model
    app = build_app(
        backend,
        model_name=name,
        max_batch=args.max_batch,
        batch_wait_ms=args.batch_wait_ms,
        default_max_tokens=args.default_max_tokens,
    )
    print(
        f"rlf-serve: {name} on http://{args.host}:{args.port}/v1 ({args.backend})",
        file=sys.stderr,
        flush=True,
    )
    web.run_app(
        app, host=args.host, port=args.port, print=None, access_log=logger if level <= logging.INFO else None
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
