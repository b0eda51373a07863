"""RemotePolicy: generation on OpenAI-compatible inference servers that scale apart from the trainer.

Each request goes to ``POST <server>/v1/completions`` with the prompt as token ids and asks for the
sampled ids and their raw log-probabilities back (``logprobs: 0``, vLLM's ``return_token_ids``),
so the token-exact contract of :mod:`~rlf_trainer.policy.base` holds: the ids the trainer trains on
are the ids the server sampled, never re-tokenized text. Every request carries its own seed, and
the sampling knobs a server could otherwise default from the model's generation config
(repetition penalty, min_p, top_k) are sent at their neutral values. ``vllm serve`` and
``rlf-serve`` both answer it.

Servers (:mod:`~rlf_trainer.policy.remote_pool`): a request goes to the server with the fewest
requests in flight; one that cannot be reached, times out or answers 5xx is taken out for a
backoff and the request goes to another. After ``max_attempts`` tries (default 2 per server + 1)
the call raises :class:`NoServerAnswered` naming every server's last error: a rollout fails its
step clearly instead of hanging (each try is bounded by ``request_timeout_s``).

Weights (:meth:`RemotePolicy.update_weights`): the trainer writes a Hugging Face folder
(safetensors; LoRA merged) under ``weights_dir``, which the servers must be able to read, and
every server runs vLLM's update sequence: ``POST /pause?mode=wait`` (requests in flight finish on
the old weights, new ones wait), ``POST /collective_rpc {"method": "reload_weights", "kwargs":
{"weights_path": DIR}}``, ``POST /update_weight_version``, ``POST /resume``. vLLM has these routes
with ``VLLM_SERVER_DEV_MODE=1``; rlf-serve always. Each completion records the version its server
held when the request was sent (``Completion.weights_version``): with ``mode=wait`` that is exactly
the version that sampled it. A server that failed may have restarted with other weights: it gets
the newest folder again before it serves.

Example (with ``rlf-serve --model DIR --port 8000`` running):
    >>> policy = RemotePolicy(["http://127.0.0.1:8000"], tokenizer, weights_dir="/shared/w")  # doctest: +SKIP
    >>> [c] = policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, seed=0))  # doctest: +SKIP
    >>> policy.update_weights(model, version=1); c.weights_version                     # doctest: +SKIP
    0
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from rlf_envs.loop_thread import LoopThread
from rlf_trainer.policy.base import (
    Completion,
    SamplingParams,
    completion_text,
    stop_ids_for,
)
from rlf_trainer.policy.remote_pool import InferenceServer, ServerPool
from rlf_trainer.policy.weights_folder import prune_weight_folders, write_weights_folder

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

_RESUME_AFTER_FAILURE_S = 10.0  # a best-effort resume after a failed update: the server may be gone
_DEV_MODE_HINT = "vLLM serves its weight-update routes only with VLLM_SERVER_DEV_MODE=1 (rlf-serve always)"


class RemotePolicyError(RuntimeError):
    """The remote policy could not do what was asked; the message says which server and why."""


class NoServerAnswered(RemotePolicyError):
    """Every try of a request failed (servers down, unreachable, timing out or answering 5xx)."""


class RemoteRequestRefused(RemotePolicyError):
    """A server refused a request as invalid (HTTP 4xx): another server would refuse it too."""


class BadServerReply(RemotePolicyError):
    """A server answered 200 with something that is not a token-id completion with logprobs."""


class WeightPushFailed(RemotePolicyError):
    """No server took the new weights."""


class RemotePolicy:
    """A :class:`~rlf_trainer.policy.base.Policy` (and async policy) over inference servers.

    Args:
        urls: the servers' base URLs (``http://host:port`` or ``.../v1``).
        tokenizer: the trained model's tokenizer (decodes completions, knows eos).
        generation_config: the model's generation config (its eos ids end completions too).
        weights_dir: where :meth:`update_weights` writes weight folders; every server must read
            the same path (a shared filesystem across nodes). Default: a temporary folder.
        model_name: sent as ``model`` (None: the server's only model).
        request_timeout_s: the longest one try of one request may take.
        max_attempts: tries per request over all servers (default ``2 * len(urls) + 1``).
        push_timeout_s: the longest one server's weight update may take.
        push_dtype: the dtype of the weight folders' floating-point tensors (None: as trained).
    """

    def __init__(
        self,
        urls: list[str],
        tokenizer: PreTrainedTokenizerBase,
        *,
        generation_config: Any = None,
        weights_dir: str | os.PathLike[str] | None = None,
        model_name: str | None = None,
        request_timeout_s: float = 300.0,
        max_attempts: int | None = None,
        push_timeout_s: float = 600.0,
        push_dtype: torch.dtype | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.pool = ServerPool(list(urls))
        self.generation_config = generation_config
        self.weights_dir = Path(weights_dir) if weights_dir else Path(tempfile.mkdtemp(prefix="rlf-weights-"))
        self.model_name = model_name
        self.request_timeout_s = request_timeout_s
        self.max_attempts = max_attempts or 2 * len(self.pool.servers) + 1
        self.push_timeout_s = push_timeout_s
        self.push_dtype = push_dtype
        self.version = 0  # the newest weights version pushed (0: what the servers started with)
        self.latest_folder: Path | None = None
        self.failovers = 0  # tries that failed and went to another server (or waited), this window
        self.closed = False
        self._loop = LoopThread("rlf-remote-policy")
        self._session: aiohttp.ClientSession | None = None
        self._push_locks: dict[int, asyncio.Lock] = {}

    # ------------------------------------------------------------------------------ generation
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, all requests in flight at once; request ``i`` has seed
        ``params.request_seeds(n)[i]``. Raises :class:`RemotePolicyError` (every request then stops)."""
        self._check_open()
        if not prompts:
            return []
        stop_ids = stop_ids_for(self.tokenizer, self.generation_config, params)
        seeds = params.request_seeds(len(prompts))

        async def all_requests() -> list[Completion]:
            async with asyncio.TaskGroup() as group:  # a failure cancels the other requests
                tasks = [group.create_task(self._complete(p, params, s, stop_ids)) for p, s in zip(prompts, seeds, strict=True)]  # fmt: skip
            return [task.result() for task in tasks]

        try:
            return self._loop.run(all_requests())
        except ExceptionGroup as group:  # the first failure, as it was raised
            raise group.exceptions[0] from None

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Completion:
        """One completion for one prompt (the async rollout's entry point); ``params.seed`` is its seed."""
        self._check_open()
        stop_ids = stop_ids_for(self.tokenizer, self.generation_config, params)
        return await self._loop.arun(self._complete(prompt, params, params.seed, stop_ids))

    async def _complete(
        self, prompt: list[int], params: SamplingParams, seed: int | None, stop_ids: list[int]
    ) -> Completion:
        body = self._request_body(prompt, params, seed, stop_ids)
        for _ in range(self.max_attempts):
            server = self.pool.pick(self.version)
            if server is None:  # every server is in its backoff: wait for the first to be tried again
                self.failovers += 1
                await asyncio.sleep(min(self.pool.next_ready_in(), self.request_timeout_s))
                continue
            if server.version is None and not await self._restore(server):
                self.failovers += 1
                continue
            completion = await self._try(server, body, stop_ids)
            if completion is not None:
                return completion
            self.failovers += 1
        raise NoServerAnswered(
            f"no inference server answered after {self.max_attempts} tries: {self.pool.describe_failures()}"
        )

    def _request_body(
        self, prompt: list[int], params: SamplingParams, seed: int | None, stop_ids: list[int]
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": list(prompt),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,  # 0: off; sent so that no server takes the model's default
            "seed": seed,
            "stop_token_ids": stop_ids,
            "logprobs": 0,  # the sampled token's raw logprob only
            "return_token_ids": True,
            "skip_special_tokens": False,
            # neutral: a server would otherwise apply the generation config's defaults
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "min_p": 0.0,
        }
        if self.model_name is not None:
            body["model"] = self.model_name
        return body

    async def _try(
        self, server: InferenceServer, body: dict[str, Any], stop_ids: list[int]
    ) -> Completion | None:
        """One try on ``server``: the completion, or None after marking the server failed.
        Raises for what another server would not fix (a refused request, a malformed reply)."""
        version = server.version
        server.begin(self.pool.now())
        try:
            status, payload = await self._post(f"{server.url}/v1/completions", body, self.request_timeout_s)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            # unreachable, reset, timed out or not JSON: it may be gone or restarting
            self.pool.mark_failed(server, f"{type(exc).__name__}: {exc}", weights_unknown=True)
            return None
        finally:
            server.end(self.pool.now())
        if status >= 500:
            self.pool.mark_failed(server, f"HTTP {status}: {_error_message(payload)}", weights_unknown=False)
            return None
        if status >= 400:
            raise RemoteRequestRefused(
                f"{server.url} refused the request (HTTP {status}): {_error_message(payload)}"
            )
        completion = self._completion(payload, stop_ids, server.url)
        completion.weights_version = version
        server.tokens += len(completion.token_ids)
        self.pool.mark_ok(server)
        return completion

    def _completion(self, payload: Any, stop_ids: list[int], url: str) -> Completion:
        try:
            choice = payload["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise BadServerReply(
                f"{url} answered without token ids and logprobs ({type(exc).__name__}: {exc}); the "
                "remote policy needs an OpenAI-compatible server that honours return_token_ids and "
                "logprobs (vllm serve, rlf-serve)"
            ) from None
        if len(ids) != len(logprobs):
            raise BadServerReply(f"{url} returned {len(ids)} token ids but {len(logprobs)} logprobs")
        finish = "stop" if ids and ids[-1] in stop_ids else "length"
        extra = {"server": url, "server_finish_reason": choice.get("finish_reason")}
        return Completion(ids, logprobs, completion_text(self.tokenizer, ids, finish), finish, extra=extra)

    # ------------------------------------------------------------------------------ weights
    def update_weights(self, model: torch.nn.Module, *, version: int | None = None) -> None:
        """Write ``model``'s weights as a Hugging Face folder under ``weights_dir`` and have every
        server load it (see the module docstring); ``version`` defaults to the last one + 1.

        A server that fails is left out (and gets the newest folder when it is back); raises
        :class:`WeightPushFailed` when no server took the weights.
        """
        self._check_open()
        version = self.version + 1 if version is None else version
        folder = write_weights_folder(model, self.weights_dir / f"v{version:06d}", dtype=self.push_dtype)
        self.push_folder(folder, version)

    def push_folder(self, folder: str | os.PathLike[str], version: int) -> None:
        """Have every server load the weights folder ``folder`` as version ``version``."""
        self._check_open()
        folder = Path(folder).resolve()
        errors = self._loop.run(self._push_all(folder, version))
        failed = [e for e in errors if e is not None]
        if len(failed) == len(self.pool.servers):
            raise WeightPushFailed(
                f"no server took weights version {version} ({folder}): {'; '.join(failed)}"
            )
        for error in failed:
            logger.warning(
                "weights version %d not loaded by %s; it gets them when it is back", version, error
            )
        self.version, self.latest_folder = version, folder
        prune_weight_folders(self.weights_dir, keep=folder)

    async def _push_all(self, folder: Path, version: int) -> list[str | None]:
        return list(await asyncio.gather(*(self._push(s, folder, version) for s in self.pool.servers)))

    async def _push(self, server: InferenceServer, folder: Path, version: int) -> str | None:
        """vLLM's update sequence on one server; None, or what went wrong (the server is marked failed)."""
        lock = self._push_locks.setdefault(server.index, asyncio.Lock())
        async with lock:
            try:
                try:
                    await self._admin(server, "/pause?mode=wait", None)
                    rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
                    await self._admin(server, "/collective_rpc", rpc)
                    server.version = version  # requests sent from now on run on these weights
                    await self._admin(server, "/update_weight_version", {"new_version": str(version)})
                except BaseException:
                    with contextlib.suppress(Exception):  # never leave a server paused if we can help it
                        await self._admin(server, "/resume", None, timeout_s=_RESUME_AFTER_FAILURE_S)
                    raise
                await self._admin(server, "/resume", None)
            except (aiohttp.ClientError, TimeoutError, ValueError, RemotePolicyError) as exc:
                self.pool.mark_failed(server, f"weight update: {exc}", weights_unknown=True)
                return f"{server.url}: {type(exc).__name__}: {exc}"
        return None

    async def _restore(self, server: InferenceServer) -> bool:
        """A server back from a failure serves unknown weights: give it the newest folder (or, when
        none was ever pushed, take it as serving the weights it started with)."""
        if self.latest_folder is None:
            server.version = 0
            return True
        return await self._push(server, self.latest_folder, self.version) is None

    async def _admin(
        self,
        server: InferenceServer,
        route: str,
        body: dict[str, Any] | None,
        *,
        timeout_s: float | None = None,
    ) -> None:
        status, payload = await self._post(f"{server.url}{route}", body, timeout_s or self.push_timeout_s)
        if status == 404:
            raise RemotePolicyError(f"{server.url}{route} does not exist: {_DEV_MODE_HINT}")
        if status >= 400:
            raise RemotePolicyError(f"{server.url}{route}: HTTP {status}: {_error_message(payload)}")

    def refresh_versions(self) -> None:
        """Ask every server which weights version it serves (``GET /weight_info``): for a process that
        did not push them itself (the trainer's other ranks). Unreachable servers become unknown."""
        self._check_open()
        self._loop.run(self._refresh_versions())
        known = [s.version for s in self.pool.servers if s.version is not None]
        self.version = max(known, default=self.version)
        folder = self.weights_dir / f"v{self.version:06d}"
        if folder.is_dir():  # what the pushing process wrote: a server back from a failure gets it
            self.latest_folder = folder.resolve()

    async def _refresh_versions(self) -> None:
        session = await self._get_session()
        for server in self.pool.servers:
            try:
                async with session.get(
                    f"{server.url}/weight_info", timeout=aiohttp.ClientTimeout(total=30)
                ) as r:
                    reported = (await r.json(content_type=None)).get("weight_version")
                server.version = int(reported) if str(reported).isdigit() else 0  # "default": its own
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                server.version = None

    # ------------------------------------------------------------------------------ plumbing
    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            # no connection limit: the rollout bounds the requests in flight
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def _post(self, url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
        session = await self._get_session()
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(url, json=body, timeout=timeout) as response:
            text = await response.text()
        if not text:
            return response.status, None
        try:
            return response.status, json.loads(text)
        except json.JSONDecodeError:
            if response.status < 400:
                raise ValueError(f"{url} answered {response.status} with a body that is not JSON") from None
            return response.status, text

    def take_metrics(self) -> dict[str, float]:
        """Metrics since the last call: per server the peak requests in flight (its queue depth
        as this process sees it) and generated tokens per busy second; servers up; failovers."""
        if self.closed:
            return {}

        async def snapshot() -> dict[str, float]:  # on the loop: the counters change there
            out = self.pool.take_metrics() | {"remote/failovers": float(self.failovers)}
            self.failovers = 0
            return out

        return self._loop.run(snapshot())

    def _check_open(self) -> None:
        if self.closed:
            raise RemotePolicyError("RemotePolicy used after close()")

    def sleep(self) -> None:
        """Nothing to free: the servers run elsewhere."""

    def wake_up(self) -> None:
        """Nothing to bring back."""

    def close(self) -> None:
        """Close the HTTP session and the policy's loop thread (idempotent); the servers keep running."""
        if self.closed:
            return
        self.closed = True
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._loop.run(self._session.close(), timeout=10)
        self._loop.close()


def _error_message(payload: Any) -> str:
    """The message of an OpenAI-style (or FastAPI-style) error body, else the body itself, short."""
    if isinstance(payload, dict):
        error = payload.get("error", payload.get("detail", payload))
        if isinstance(error, dict):
            error = error.get("message", error)
        return str(error)[:500]
    return str(payload)[:500]


__all__ = [
    "BadServerReply",
    "NoServerAnswered",
    "RemotePolicy",
    "RemotePolicyError",
    "RemoteRequestRefused",
    "WeightPushFailed",
    "write_weights_folder",
]
