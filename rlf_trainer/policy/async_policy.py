"""The async policy contract: one request in, one completion out, awaitable, many in flight at once.

The asynchronous rollout (:mod:`rlf_trainer.rollout.async_rollout`) runs every episode as its own coroutine
and asks for one turn at a time with :meth:`AsyncPolicy.agenerate`. A policy with an engine that
batches requests as they come (vLLM: :meth:`~rlf_trainer.policy.vllm.VLLMPolicy.agenerate`)
implements it natively; :func:`as_async_policy` adapts any other :class:`~rlf_trainer.policy.base.Policy`
by running its requests one at a time on a worker thread, which keeps the event loop free (tools
and envs go on) but gives no batching: that is why the HF backend trains with the lockstep rollout.

``params.seed`` is the request's own seed (the rollout gives every request a distinct one).

Example:
    >>> import asyncio
    >>> from rlf_trainer.policy.base import Completion, SamplingParams
    >>> class Echo:  # a Policy that repeats the prompt's last token
    ...     tokenizer = None
    ...     def generate(self, prompts, params):
    ...         return [Completion([p[-1]], [0.0], "x", "length") for p in prompts]
    >>> policy = as_async_policy(Echo())
    >>> asyncio.run(policy.agenerate([5, 6, 7], SamplingParams(max_new_tokens=1))).token_ids
    [7]
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol, runtime_checkable

from rlf_trainer.policy.base import Completion, Policy, SamplingParams


@runtime_checkable
class AsyncPolicy(Protocol):
    """Generates one completion per awaited call; calls may overlap freely."""

    tokenizer: Any

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Completion: ...


class SerialAsyncPolicy:
    """Any :class:`Policy` as an :class:`AsyncPolicy`: one request at a time, on a worker thread."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.tokenizer = policy.tokenizer
        self._lock = threading.Lock()  # a Policy is not required to be thread-safe

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Completion:
        def one() -> Completion:
            with self._lock:
                (completion,) = self.policy.generate([list(prompt)], params)
            return completion

        return await asyncio.to_thread(one)


def as_async_policy(policy: Any) -> AsyncPolicy:
    """``policy`` itself when it has ``agenerate``, else :class:`SerialAsyncPolicy` around it."""
    if callable(getattr(policy, "agenerate", None)):
        return policy
    return SerialAsyncPolicy(policy)
