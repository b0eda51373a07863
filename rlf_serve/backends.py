"""rlf-serve backends: a whole batch of requests in, one reply each out (runs on a worker thread)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from rlf_trainer.policy.base import Policy

from rlf_serve.protocol import (
    ChatReply,
    ChatRequest,
    CompletionReply,
    CompletionRequest,
    FinishReason,
    apply_stop_strings,
)

logger = logging.getLogger("rlf_serve")


AnyRequest = ChatRequest | CompletionRequest
AnyReply = ChatReply | CompletionReply


class ChatBackend(Protocol):
    """Generates replies for a batch of requests; called on a worker thread, one batch at a time.

    A batch may mix chat and token-id completion requests; each gets a reply of its own kind.
    """

    def generate(self, requests: Sequence[AnyRequest]) -> list[AnyReply]: ...

    def generate_calls(self, requests: Sequence[AnyRequest]) -> int:
        """How many model calls :meth:`generate` will make for ``requests``."""
        ...


class PolicyChatBackend:
    """Chat and token-id completions on top of a :class:`~rlf_trainer.policy.base.Policy` (HF or vLLM).

    Chat prompts are rendered with the tokenizer's chat template (:func:`rlf_trainer.rollout.chat.prompt_ids`,
    ``tools`` included); completion prompts are token ids already. Requests that share their sampling
    settings (and seed) go to one ``policy.generate`` call with the largest ``max_tokens`` among
    them; each reply is then cut to its own ``max_tokens`` (and chat ``stop`` strings): sampling is
    left to right, so a cut continuation is distributed exactly like a shorter one. A seeded
    request is therefore generated on its own, and its sample does not depend on what else was in
    flight. :meth:`load_weights` swaps the weights in place from a checkpoint folder.
    """

    def __init__(self, policy: Policy, tokenizer: PreTrainedTokenizerBase) -> None:
        self.policy = policy
        self.tokenizer = tokenizer

    def generate_calls(self, requests: Sequence[AnyRequest]) -> int:
        return len({_group_key(r) for r in requests})

    def close(self) -> None:
        """Shut the policy's engine down (vLLM); the server calls it on exit."""
        self.policy.close()

    def load_weights(self, folder: str) -> None:
        """Load the safetensors of the Hugging Face folder ``folder`` into the served model in place.

        vLLM: its worker-side ``reload_weights`` with the folder's tensors (:func:`read_weights_folder`)
        and a prefix-cache reset; HF: a checked in-place copy (:func:`load_hf_weights`). Raises
        :class:`WeightsLoadError`.
        """
        llm = getattr(self.policy, "llm", None)
        if llm is not None:  # VLLMPolicy: the engine runs in this process, tensors pass by reference
            weights = read_weights_folder(folder)
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            llm.reset_prefix_cache()
            return
        load_hf_weights(self.policy.model, folder)  # type: ignore[attr-defined]
        cache = getattr(self.policy, "prefix_cache", None)
        if cache is not None:  # it would also notice the new weights; dropping it now frees its memory
            cache.clear()

    def generate(self, requests: Sequence[AnyRequest]) -> list[AnyReply]:
        from rlf_trainer.policy.base import SamplingParams
        from rlf_trainer.rollout.chat import prompt_ids

        prompts = [
            list(r.prompt)
            if isinstance(r, CompletionRequest)
            else prompt_ids(self.tokenizer, r.messages, r.tools)
            for r in requests
        ]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(_group_key(request), []).append(i)
        replies: list[AnyReply | None] = [None] * len(requests)
        for members in groups.values():
            first = requests[members[0]]
            params = SamplingParams(
                max_new_tokens=max(requests[i].max_tokens for i in members),
                temperature=first.temperature,
                top_p=first.top_p,
                top_k=first.top_k if isinstance(first, CompletionRequest) else 0,
                stop_token_ids=first.stop_token_ids if isinstance(first, CompletionRequest) else (),
                seed=first.seed,
            )
            completions = self.policy.generate([prompts[i] for i in members], params)
            for i, completion in zip(members, completions, strict=True):
                request = requests[i]
                if isinstance(request, CompletionRequest):
                    replies[i] = self._completion_reply(request, completion)
                else:
                    replies[i] = self._reply(
                        request, len(prompts[i]), completion.token_ids, completion.finish_reason
                    )
        return [r for r in replies if r is not None]

    def _completion_reply(self, request: CompletionRequest, completion: Any) -> CompletionReply:
        ids, logprobs, finish = completion.token_ids, completion.logprobs, completion.finish_reason
        if len(ids) > request.max_tokens:  # generated for a longer request of the same batch
            ids, logprobs, finish = ids[: request.max_tokens], logprobs[: request.max_tokens], "length"
        body = ids[:-1] if finish == "stop" else ids
        text = self.tokenizer.decode(body, skip_special_tokens=request.skip_special_tokens)
        stop_reason = ids[-1] if finish == "stop" else None
        return CompletionReply(list(ids), list(logprobs), text, finish, len(request.prompt), stop_reason)

    def _reply(
        self, request: ChatRequest, prompt_len: int, token_ids: list[int], finish: FinishReason
    ) -> ChatReply:
        if len(token_ids) > request.max_tokens:  # generated for a longer request of the same batch
            token_ids, finish = token_ids[: request.max_tokens], "length"
        body = token_ids[:-1] if finish == "stop" else token_ids  # the end-of-turn token is not content
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        text, stopped = apply_stop_strings(text, request.stop)
        return ChatReply(text, "stop" if stopped else finish, prompt_len, len(token_ids))


def _group_key(request: AnyRequest) -> tuple[Any, ...]:
    """Requests with equal keys share one generate call (chat and completions never mix)."""
    return (type(request).__name__, *request.sampling_key())


class WeightsLoadError(RuntimeError):
    """A weights folder that does not fit the served model (missing, unexpected or misshapen tensors)."""


def read_weights_folder(folder: str | Path) -> dict[str, Any]:
    """Every tensor of ``folder/*.safetensors``; a tied ``lm_head.weight`` that ``save_pretrained``
    left out is added back as the input embeddings (vLLM's in-place reload keeps the old head of a
    tied model when the weights do not name it). Raises :class:`WeightsLoadError` without files."""
    import json

    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightsLoadError(f"no *.safetensors file in {folder}")
    given: dict[str, Any] = {}
    for file in files:
        given.update(load_file(str(file)))
    config_file = Path(folder) / "config.json"
    tied = config_file.is_file() and json.loads(config_file.read_text()).get("tie_word_embeddings", False)
    if tied and "lm_head.weight" not in given and "model.embed_tokens.weight" in given:
        given["lm_head.weight"] = given["model.embed_tokens.weight"]
    return given


def load_hf_weights(model: Any, folder: str | Path) -> None:
    """Copy every tensor of ``folder/*.safetensors`` into ``model`` in place (no gradient).

    Every parameter and buffer of the model must be given, except one tied to a given tensor
    (``lm_head.weight`` under tied embeddings, which ``save_pretrained`` leaves out).

    Example (a random in-memory Qwen3 saved and loaded back):
        >>> import tempfile, torch
        >>> from transformers import Qwen3Config, Qwen3ForCausalLM
        >>> config = Qwen3Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=1, head_dim=4)
        >>> source, target = Qwen3ForCausalLM(config), Qwen3ForCausalLM(config)
        >>> folder = tempfile.mkdtemp(); source.save_pretrained(folder)
        >>> load_hf_weights(target, folder)
        >>> all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
        True
    """
    import torch

    given = read_weights_folder(folder)
    own = model.state_dict()
    unexpected = sorted(set(given) - set(own))
    misshapen = sorted(k for k in set(given) & set(own) if given[k].shape != own[k].shape)
    given_storage = {own[k].data_ptr() for k in given if k in own}
    missing = sorted(k for k in set(own) - set(given) if own[k].data_ptr() not in given_storage)
    if unexpected or misshapen or missing:
        raise WeightsLoadError(
            f"the weights in {folder} do not fit the served model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}, other shapes {misshapen[:5]}"
        )
    with torch.no_grad():
        for name, tensor in given.items():
            own[name].copy_(tensor)


def load_backend(
    model: str,
    backend: Literal["hf", "vllm"] = "hf",
    *,
    dtype: str = "auto",
    device: str | None = None,
    gpu_memory_utilization: float = 0.8,
    prefix_cache_tokens: int = 32768,
) -> PolicyChatBackend:
    """Load ``model`` (a Hugging Face folder or hub id) behind :class:`PolicyChatBackend`.

    ``hf``: transformers on ``device`` (default cuda if available, else cpu); ``dtype`` "auto" is
    bfloat16 where the device has bf16 arithmetic (a CUDA device that reports it, a CPU with
    AVX512-BF16 or AMX) and float32 elsewhere; ``prefix_cache_tokens`` bounds the HF policy's
    key/value store between requests (0: off, so a sample never depends on which requests came
    before it). ``vllm``: :class:`~rlf_trainer.policy.vllm.VLLMPolicy`.
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
    from rlf_trainer.run.grouped_attention import use_grouped_sdpa

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
    use_grouped_sdpa(hf_model)
    hf_model.eval()
    return PolicyChatBackend(
        HFPolicy(hf_model, tokenizer, prefix_cache_tokens=prefix_cache_tokens), tokenizer
    )
