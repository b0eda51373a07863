"""HFPolicy: generation with transformers' ``model.generate``, on the training module itself.

For CPU runs and tests. Sharing the training module means no weight sync: after an optimizer step
the next :meth:`HFPolicy.generate` already samples from the new weights.

Example:
    >>> from transformers import AutoModelForCausalLM, AutoTokenizer
    >>> from rlf_trainer.policy.base import SamplingParams
    >>> policy = HFPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir))
    >>> [c] = policy.generate([[1, 2, 3]], SamplingParams(max_new_tokens=16, seed=0))  # the tiny random model
    >>> c.finish_reason, len(c.token_ids) == len(c.logprobs) == 16
    ('length', True)
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from rlf_trainer.policy.base import (
    Completion,
    SamplingParams,
    completion_text,
    inference_state_dict,
    stop_ids_for,
)
from rlf_trainer.policy.prefix_cache import (
    PrefixKVStore,
    PrefixMatch,
    build_prefix_batch,
    supports_prefix_cache,
)
from rlf_trainer.seeds import batch_seed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

# Every knob a checkpoint's generation_config.json could set that applies to greedy decoding, at its
# neutral value: SamplingParams is the whole specification. Sampling runs as a greedy `generate`
# whose last logits processor draws the token (rlf_trainer.policy.sampling), so the checkpoint's
# warpers (temperature, top-k/p, min_p, ...) never run: transformers applies them only with do_sample.
_NEUTRAL_PROCESSORS = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "min_new_tokens": 0,
    "num_beams": 1,
}


class HFPolicy:
    """Batched sampling with ``model.generate`` (left padding), returning raw token log-probabilities.

    ``model`` may be the module being trained (weights are shared). It is switched to eval mode for
    the call (no dropout while sampling) and restored afterwards. ``max_batch_size`` splits a large
    batch into sequential chunks to bound memory; results are identical up to sampling randomness.

    ``prefix_cache_tokens``: key/value states of up to that many tokens are kept between calls, so a
    multi-turn rollout's next turn computes only its new tokens (:mod:`~rlf_trainer.policy.prefix_cache`;
    0 turns it off, and models with sliding-window layers never use it).

    ``generation_dtype`` other than the model's (bf16 for an fp32 model under bf16 mixed precision):
    the policy samples with its own copy in that dtype (LoRA merged), which :meth:`update_weights`
    refreshes after each optimizer step. Autocast would cast every weight at every decoding step,
    which costs as much as it saves; a bf16 copy decodes at the bf16 rate.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int | None = None,
        prefix_cache_tokens: int = 32768,
        generation_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = _generation_copy(model, generation_dtype)
        # a copy's weights are freed while the policy sleeps (training), rebuilt from the trained
        # module's after; only where that module holds whole plain tensors (not sharded ones)
        self._copied_from = (
            model if self.model is not model and _holds_whole_tensors(model, self.model) else None
        )
        self._released: list[tuple[torch.nn.Parameter, torch.Size]] = []
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        use_store = prefix_cache_tokens > 0 and supports_prefix_cache(self.model)
        self.prefix_cache = PrefixKVStore(self.model, prefix_cache_tokens) if use_store else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample one completion per prompt.

        Sampling uses ``params`` on every call (temperature, top_p, top_k; greedy iff temperature
        is 0), whatever the model's generation config says. Each completion stops at the first
        eos / stop id, which it keeps; ``logprobs`` are log_softmax of the raw logits at each step.
        Deterministic for a given ``params.seed`` (the global torch RNG is left untouched). With
        per-request ``params.seeds`` the batch is sampled from one stream seeded by all of them
        (:func:`~rlf_trainer.seeds.batch_seed`): ``generate`` draws a batch's tokens together, so a
        row's sample also depends on which requests share its batch.
        """
        if not prompts:
            return []
        self.wake_up()  # a copy freed by sleep() comes back first
        if any(not prompt for prompt in prompts):
            raise ValueError("every prompt needs at least one token")
        stop_ids = stop_ids_for(self.tokenizer, self.model.generation_config, params)
        chunk = self.max_batch_size or len(prompts)
        completions: list[Completion] = []
        seed = batch_seed(params.seeds) if params.seeds is not None else params.seed
        if params.seeds is not None and len(params.seeds) != len(prompts):
            raise ValueError(f"{len(params.seeds)} seeds for {len(prompts)} prompts")
        with self._sampling_mode(seed):
            for start in range(0, len(prompts), chunk):
                completions.extend(self._generate_batch(prompts[start : start + chunk], params, stop_ids))
        return completions

    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, stop_ids: list[int]
    ) -> list[Completion]:
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else stop_ids[0]
        store = self.prefix_cache
        # Without stored states every row is [pad][prompt]: plain left padding.
        matches = store.lookup(prompts) if store is not None else [PrefixMatch()] * len(prompts)
        batch = build_prefix_batch(
            prompts, matches, pad_id, self.device, self.model.config, new_tokens=params.max_new_tokens
        )
        out = self.model.generate(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            past_key_values=batch.past,
            generation_config=_generation_config(params, stop_ids, pad_id),
            logits_processor=_sampler(params),
        )
        new_tokens = out.sequences[:, batch.input_ids.shape[1] :]
        logprobs = torch.stack(
            [
                torch.log_softmax(step_logits.float(), dim=-1).gather(1, new_tokens[:, t : t + 1]).squeeze(1)
                for t, step_logits in enumerate(out.logits)
            ],
            dim=1,
        )
        completions = [
            self._completion(row_ids, row_logprobs, stop_ids)
            for row_ids, row_logprobs in zip(new_tokens.tolist(), logprobs.tolist(), strict=True)
        ]
        if store is not None:
            store.remember(batch, prompts, [c.token_ids for c in completions], out.past_key_values)
        return completions

    def _completion(self, token_ids: list[int], logprobs: list[float], stop_ids: list[int]) -> Completion:
        stops = set(stop_ids)
        end = next((t + 1 for t, token in enumerate(token_ids) if token in stops), None)
        finish_reason = "stop" if end is not None else "length"
        # Rows that finished early were padded by generate; a row that never stopped ran to max_new_tokens.
        token_ids, logprobs = token_ids[:end], logprobs[:end]
        return Completion(
            token_ids, logprobs, completion_text(self.tokenizer, token_ids, finish_reason), finish_reason
        )

    @contextlib.contextmanager
    def _sampling_mode(self, seed: int | None) -> Iterator[None]:
        was_training = self.model.training
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            self.model.eval()
            try:  # a trained model under `compile: true` decodes eagerly (rlf_trainer.run.compile)
                with torch.compiler.set_stance("force_eager"), _contiguous_head_input(self.model):
                    yield
            finally:
                self.model.train(was_training)

    def update_weights(self, model: torch.nn.Module) -> None:
        """No-op when ``model`` shares this policy's module; otherwise copy its (merged) weights in.

        Shared means the same module, possibly behind DDP/accelerate wrappers or a PEFT wrapper
        (LoRA layers are injected into the base model in place, so it generates with them).
        """
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        if _core_module(model) is _core_module(self.model):
            return
        for param, shape in self._released:  # freed by sleep(): the weights come back whole
            param.data = torch.empty(shape, dtype=param.dtype, device=param.device)
        self._released = []
        with torch.no_grad():
            self.model.load_state_dict(inference_state_dict(model), strict=True)

    def sleep(self) -> None:
        """Free the stored prefix states (training is about to change the weights they belong to)
        and a copy's weights: the update's activations reuse that memory (0.27 GB for SmolLM2-135M
        in bf16), and :meth:`update_weights` or :meth:`wake_up` rebuild the copy."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        if self._copied_from is not None and not self._released:
            self._released = [(param, param.shape) for param in self.model.parameters()]
            for param, _ in self._released:
                param.data = param.data.new_empty(0)

    def wake_up(self) -> None:
        """A copy freed by :meth:`sleep` and not refreshed since is rebuilt from the trained module."""
        if self._released:  # only a copy with a source to rebuild from is ever released
            self.update_weights(self._copied_from)

    def close(self) -> None:
        """Release the stored prefix states; the model belongs to the caller."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()


@contextlib.contextmanager
def _contiguous_head_input(model: Any) -> Iterator[None]:
    """Within the block ``model``'s output projection gets contiguous inputs.

    ``generate``'s prefill projects each row's last position only, a slice whose batch stride spans
    the whole prompt; without autograd, torch 2.13's CPU linear then copies the head to
    ``[rows, H, V]`` for a batched matmul: 0.96 s and 0.9 GB for 16 rows of SmolLM2 in bf16 (3.7 ms
    for the same rows contiguous), 40 ms in fp32 (6.7 ms).
    """
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, torch.nn.Module):
        yield
        return
    handle = head.register_forward_pre_hook(lambda _module, args: (args[0].contiguous(), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


def _generation_copy(model: Any, dtype: torch.dtype | None) -> Any:
    """``model`` itself when it already computes in ``dtype`` (or none is asked), else a frozen copy
    in ``dtype`` with any LoRA adapters merged in."""
    core = _core_module(model) if not hasattr(model, "peft_config") else model
    if dtype is None or next(core.parameters()).dtype == dtype:
        return model
    twin = copy.deepcopy(core)
    for patched in ("forward", "_original_forward"):  # Accelerate's autocast wrapper of the trained model
        twin.__dict__.pop(patched, None)
    if hasattr(twin, "merge_and_unload"):  # PEFT: generate with the merged weights
        twin = twin.merge_and_unload()
    return twin.to(dtype).requires_grad_(False).eval()


def _holds_whole_tensors(model: Any, copy_of_it: Any) -> bool:
    """True when each of the copy's parameters is, under its name, a plain tensor of the same shape
    in ``model`` (not a shard, a DTensor or a ZeRO-3 placeholder; not LoRA, whose copy is merged),
    so the copy can be rebuilt from ``model`` at any time."""
    source = dict(_core_module(model).named_parameters())
    return all(
        name in source and type(source[name].data) is torch.Tensor and source[name].shape == param.shape
        for name, param in copy_of_it.named_parameters()
    )


def _core_module(model: torch.nn.Module) -> torch.nn.Module:
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # DDP / accelerate wrappers
        model = model.module
    get_base_model = getattr(model, "get_base_model", None)  # PEFT
    return get_base_model() if callable(get_base_model) else model


def _generation_config(params: SamplingParams, stop_ids: list[int], pad_id: int) -> Any:
    """``generate``'s config for ``params``: greedy decoding (a sampled token is chosen by
    :func:`_sampler`'s processor), every processor a checkpoint could set held at its neutral value."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        **_NEUTRAL_PROCESSORS,
        max_new_tokens=params.max_new_tokens,
        eos_token_id=stop_ids,
        pad_token_id=pad_id,
        output_logits=True,  # raw logits, before temperature / top-p: our logprob definition
        return_dict_in_generate=True,
        use_cache=True,
    )


def _sampler(params: SamplingParams) -> Any:
    """The logits processors that sample ``params``' distribution (none for greedy decoding)."""
    from transformers import LogitsProcessorList

    from rlf_trainer.policy.sampling import InverseCdfSampler  # here: it imports transformers on import

    if params.greedy:
        return LogitsProcessorList()
    return LogitsProcessorList([InverseCdfSampler(params.temperature, params.top_k, params.top_p)])
