"""rlf-serve backends: a whole batch of chat requests in, one reply each out (runs on a worker thread)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlf_trainer.policy.base import Policy

from rlf_serve.protocol import ChatReply, ChatRequest, FinishReason, apply_stop_strings

logger = logging.getLogger("rlf_serve")


class ChatBackend(Protocol):
    """Generates replies for a batch of requests; called on a worker thread, one batch at a time."""

    def generate(self, requests: Sequence[ChatRequest]) -> list[ChatReply]: ...

    def generate_calls(self, requests: Sequence[ChatRequest]) -> int:
        """How many model calls :meth:`generate` will make for ``requests``."""
        ...


class PolicyChatBackend:
    """Chat on top of a :class:`~rlf_trainer.policy.base.Policy` (HF or vLLM).

    Prompts are rendered with the tokenizer's chat template (:func:`rlf_trainer.rollout.chat.prompt_ids`,
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
        from rlf_trainer.policy.base import SamplingParams
        from rlf_trainer.rollout.chat import prompt_ids

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
    bfloat16 where the device has bf16 arithmetic (a CUDA device that reports it, a CPU with
    AVX512-BF16 or AMX) and float32 elsewhere. ``vllm``: :class:`~rlf_trainer.policy.vllm.VLLMPolicy`.
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
    if dtype == "auto":  # bf16 where the chip multiplies it natively (the trainer's mixed_precision rule)
        from rlf_trainer.run.precision import NATIVE_BF16_CPU_FLAGS, cuda_has_bf16, read_cpu_flags

        native = (
            cuda_has_bf16() if device.startswith("cuda") else bool(read_cpu_flags() & NATIVE_BF16_CPU_FLAGS)
        )
        torch_dtype = torch.bfloat16 if native else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(model)
    hf_model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).to(device)
    hf_model.eval()
    return PolicyChatBackend(HFPolicy(hf_model, tokenizer), tokenizer)
