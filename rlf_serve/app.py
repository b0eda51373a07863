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
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    pass
from rlf_serve.backends import ChatBackend, load_backend
from rlf_serve.batching import BatchingGenerator, ServerStats
from rlf_serve.protocol import RequestError, parse_chat_request

logger = logging.getLogger("rlf_serve")


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
