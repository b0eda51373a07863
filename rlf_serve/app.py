"""rlf-serve: an OpenAI-compatible chat server over a local model that batches concurrent requests.

Endpoints: ``POST /v1/chat/completions`` (messages, max_tokens / max_completion_tokens, temperature,
top_p, n=1, stop, seed, tools), ``POST /v1/completions`` with a token-id ``prompt`` (max_tokens,
temperature, top_p, top_k, seed, stop_token_ids, ``logprobs: 0`` and vLLM's ``return_token_ids``:
the sampled ids and their raw log-probabilities, what an RL trainer needs), ``GET /v1/models``, ``GET /health`` and ``GET /stats`` (requests
served, in-flight and peak in-flight requests, batches run, largest batch, the batch generating
now); ``POST /stats/reset`` zeroes the counters. Weight updates use vLLM's routes and payloads
(``vllm serve`` with ``VLLM_SERVER_DEV_MODE=1`` has the same), so a trainer drives both alike:
``POST /pause?mode=wait``, ``POST /collective_rpc {"method": "reload_weights", "kwargs":
{"weights_path": DIR}}`` (a Hugging Face folder's safetensors, loaded in place between batches),
``POST /update_weight_version {"new_version": "7"}``, ``POST /resume``; ``GET /weight_info``,
``GET /is_paused``, ``POST /reset_prefix_cache``. Errors come back in OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``.

Concurrent requests are gathered for up to ``--batch-wait-ms`` (or until ``--max-batch``) and
generated in one call on a worker thread, so the event loop keeps accepting while the model runs;
requests that arrive during a generation form the next batch. The port opens only once the model
is loaded, so "accepts connections" means "ready".

Example::

    rlf-serve --model ~/.cache/rlf/models/smollm2-135m --port 8000          # or python -m rlf_serve
    curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
        -d '{"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'

From Python, any OpenAI client works (``base_url="http://127.0.0.1:8000/v1"``), and so do
:class:`rlf_envs.rewards.judge.JudgeReward` and the agent MCP server ``rlf_envs.servers.agent``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aiohttp import web

from rlf_serve.backends import AnyReply, AnyRequest, ChatBackend, load_backend
from rlf_serve.batching import BatchingGenerator, ServerStats
from rlf_serve.protocol import (
    ChatReply,
    CompletionReply,
    CompletionRequest,
    RequestError,
    parse_chat_request,
    parse_completion_request,
)

logger = logging.getLogger("rlf_serve")


_BATCHER = web.AppKey("batcher", BatchingGenerator)
_STATS = web.AppKey("stats", ServerStats)
_SETTINGS = web.AppKey("settings", dict)


def _error(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


async def _generate(
    request: web.Request, parse: Callable[[Any, int], AnyRequest], default_max_tokens: int | None = None
) -> tuple[AnyRequest, AnyReply]:
    """Parse, check the model name, queue for a batch and wait; counts in ``/stats``. Raises RequestError."""
    stats, settings = request.app[_STATS], request.app[_SETTINGS]
    stats.in_flight += 1
    stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
    try:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"the body is not valid JSON: {exc}") from None
        parsed = parse(body, default_max_tokens or settings["default_max_tokens"])
        model = body.get("model")
        if model is not None and model != settings["model_name"]:
            raise RequestError(
                f"the model {model!r} does not exist; this server serves {settings['model_name']!r}",
                status=404, param="model", code="model_not_found",
            )  # fmt: skip
        try:
            reply = await request.app[_BATCHER].submit(parsed)
        except Exception as exc:
            raise RequestError(f"generation failed: {type(exc).__name__}: {exc}", status=500) from exc
    except RequestError:
        stats.errors += 1
        raise
    finally:
        stats.in_flight -= 1
    stats.requests += 1
    stats.prompt_tokens += reply.prompt_tokens
    stats.completion_tokens += (
        len(reply.token_ids) if isinstance(reply, CompletionReply) else reply.completion_tokens
    )
    return parsed, reply


async def _chat_completions(request: web.Request) -> web.Response:
    try:
        _, reply = await _generate(
            request, lambda body, default: parse_chat_request(body, default_max_tokens=default)
        )
    except RequestError as exc:
        return _error(exc)
    assert isinstance(reply, ChatReply)
    return web.json_response(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.app[_SETTINGS]["model_name"],
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


async def _completions(request: web.Request) -> web.Response:
    """``POST /v1/completions`` with a token-id prompt, in vLLM's response shape (``token_ids``,
    ``logprobs.token_logprobs``, ``stop_reason``), so one client reads rlf-serve and vLLM alike."""
    try:
        # OpenAI's completions default is 16 tokens, not the server's chat default
        parsed, reply = await _generate(
            request, lambda body, default: parse_completion_request(body, default_max_tokens=default), 16
        )
    except RequestError as exc:
        return _error(exc)
    assert isinstance(parsed, CompletionRequest) and isinstance(reply, CompletionReply)
    choice: dict[str, Any] = {
        "index": 0,
        "text": reply.text,
        "logprobs": None,
        "finish_reason": reply.finish_reason,
        "stop_reason": reply.stop_reason,
    }
    if parsed.logprobs:
        tokens = (
            [f"token_id:{t}" for t in reply.token_ids]
            if parsed.tokens_as_ids
            else [request.app[_SETTINGS]["token_text"](t) for t in reply.token_ids]
        )
        choice["logprobs"] = {
            "tokens": tokens,
            "token_logprobs": reply.logprobs,
            "top_logprobs": None,
            "text_offset": [],
        }
    if parsed.return_token_ids:
        choice["token_ids"] = reply.token_ids
        choice["prompt_token_ids"] = list(parsed.prompt)
    return web.json_response(
        {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": request.app[_SETTINGS]["model_name"],
            "choices": [choice],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": len(reply.token_ids),
                "total_tokens": reply.prompt_tokens + len(reply.token_ids),
            },
        }
    )


# ----------------------------------------------------------------------------------------------
# Weight updates: vLLM's routes (VLLM_SERVER_DEV_MODE=1) and payloads, so one client drives both
# ----------------------------------------------------------------------------------------------


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json() if request.can_read_body else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


async def _pause(request: web.Request) -> web.Response:
    """``POST /pause?mode=wait|keep``: the batch generating now finishes, the next waits for /resume.

    Both modes mean the same here (a request is generated whole within one batch); vLLM's default
    ``abort`` is refused rather than silently waiting."""
    mode = request.query.get("mode", "abort")
    if mode not in ("wait", "keep"):
        return _error(
            RequestError(f"pause mode {mode!r} is not supported; use mode=wait or mode=keep", param="mode")
        )
    await request.app[_BATCHER].pause()
    return web.json_response({"status": "paused"})


async def _resume(request: web.Request) -> web.Response:
    request.app[_BATCHER].resume()
    return web.json_response({"status": "resumed"})


async def _is_paused(request: web.Request) -> web.Response:
    return web.json_response({"is_paused": request.app[_BATCHER].paused})


async def _collective_rpc(request: web.Request) -> web.Response:
    """``POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}``: load the
    safetensors of ``DIR`` (a Hugging Face folder) into the served model in place, between batches."""
    try:
        body = await _json_body(request)
        method, kwargs = body.get("method"), body.get("kwargs") or {}
        if method != "reload_weights":
            raise RequestError(
                f"rlf-serve runs only the collective_rpc method 'reload_weights' (an in-place reload "
                f"from a checkpoint folder), got {method!r}",
                param="method",
            )
        path = kwargs.get("weights_path") if isinstance(kwargs, dict) else None
        if not isinstance(path, str) or not Path(path).is_dir():
            raise RequestError(f"kwargs.weights_path must be a folder this server can read, got {path!r}",
                               param="kwargs")  # fmt: skip
        backend = request.app[_SETTINGS]["backend"]
        try:
            await request.app[_BATCHER].exclusive(lambda: backend.load_weights(path))
        except Exception as exc:
            raise RequestError(f"reload_weights failed: {type(exc).__name__}: {exc}", status=500) from exc
    except RequestError as exc:
        return _error(exc)
    request.app[_STATS].weight_reloads += 1
    return web.json_response({"results": [None]})


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    """``POST /reset_prefix_cache``: a no-op beyond what a reload does (the HF store empties itself
    when the weights change); here so that a vLLM client's update sequence runs unchanged."""
    return web.Response(status=200)


async def _update_weight_version(request: web.Request) -> web.Response:
    try:
        body = await _json_body(request)
    except RequestError as exc:
        return _error(exc)
    version = body.get("new_version")
    if not isinstance(version, str):
        return _error(RequestError("'new_version' must be a string", param="new_version"))
    request.app[_SETTINGS]["weight_version"] = version
    return web.json_response({"success": True, "new_version": version})


async def _weight_info(request: web.Request) -> web.Response:
    return web.json_response({"weight_version": request.app[_SETTINGS]["weight_version"]})


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
    tokenizer = getattr(backend, "tokenizer", None)
    app[_SETTINGS] = {
        "model_name": model_name,
        "default_max_tokens": default_max_tokens,
        "created": int(time.time()),
        "backend": backend,
        "weight_version": "default",  # vLLM's name for the weights a server started with
        "token_text": (lambda t: tokenizer.convert_ids_to_tokens(t)) if tokenizer is not None else str,
    }
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/pause", _pause)
    app.router.add_post("/resume", _resume)
    app.router.add_get("/is_paused", _is_paused)
    app.router.add_post("/collective_rpc", _collective_rpc)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    app.router.add_post("/update_weight_version", _update_weight_version)
    app.router.add_get("/weight_info", _weight_info)
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
    parser.add_argument("--prefix-cache-tokens", type=int, default=32768, help="hf backend: key/value states kept between requests (0: off; then a seeded sample never depends on earlier requests)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice; 1 suits tiny models on a busy CPU)")  # fmt: skip
    parser.add_argument("--log-level", default="WARNING", help="INFO also logs every HTTP request")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point ``rlf-serve`` (``python -m rlf_serve``)."""
    args = _parser().parse_args(argv)
    level = getattr(logging, str(args.log_level).upper(), logging.WARNING)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.max_batch < 1:
        print("rlf-serve: --max-batch must be >= 1", file=sys.stderr)
        return 2
    if args.backend == "hf" and not Path(args.model).exists() and args.model.startswith((".", "/", "~")):
        print(f"rlf-serve: no model folder at {args.model}", file=sys.stderr)
        return 2
    if argv is None and args.backend == "hf":  # a command on the HF backend: a caching malloc
        from rlf_trainer.run.allocator import relaunch_with_fast_allocator

        relaunch_with_fast_allocator()
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
        prefix_cache_tokens=args.prefix_cache_tokens,
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
