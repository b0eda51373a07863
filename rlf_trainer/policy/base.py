"""The policy contract: batched generation from token ids, with the sampled tokens' log-probabilities.

A :class:`Policy` takes a whole batch of token-id prompts in one call and returns one
:class:`Completion` per prompt. The trainer never retokenizes generated text: ``token_ids`` go
into the training sequence as they are.

Log-probabilities: ``Completion.logprobs[t]`` is ``log p(token_ids[t] | prefix)`` under the model's
*raw* next-token distribution (softmax of the logits at temperature 1, no top-k / top-p), whatever
the sampling parameters were. This is what vLLM returns by default (``logprobs_mode="raw_logprobs"``)
and what the trainer's forward pass recomputes, so the two are directly comparable.

Example:
    >>> params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=0)
    >>> completions = policy.generate([[1, 2, 3], [4, 5]], params)  # any Policy; here HFPolicy, tiny model
    >>> c = completions[0]
    >>> len(c.token_ids) == len(c.logprobs), c.finish_reason in ("stop", "length")
    (True, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch. ``temperature == 0`` means greedy.

    ``top_k == 0`` and ``top_p == 1.0`` disable those filters. ``stop_token_ids`` are added to the
    model's own end-of-sequence ids (eos of the tokenizer and of the generation config).
    ``seed`` makes the whole batch reproducible; samples within a batch still differ (so G copies of
    one prompt give G different samples). ``seeds``, one per prompt, give every request its own
    seed instead (the trainer's, from :func:`rlf_trainer.seeds.sample_seed`); see :meth:`request_seeds`.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    seeds: tuple[int, ...] | None = None

    def request_seeds(self, count: int) -> list[int | None]:
        """The seed of each of ``count`` requests: ``seeds``, else ``seed + i``, else None.

        Example:
            >>> SamplingParams(seed=5).request_seeds(2), SamplingParams(seeds=(7, 3)).request_seeds(2)
            ([5, 6], [7, 3])
        """
        if self.seeds is not None:
            if len(self.seeds) != count:
                raise ValueError(f"{len(self.seeds)} seeds for {count} requests")
            return list(self.seeds)
        return [None if self.seed is None else self.seed + i for i in range(count)]

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        if self.seeds is not None:
            object.__setattr__(self, "seeds", tuple(int(s) for s in self.seeds))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Completion:
    """One generated continuation.

    ``token_ids`` end with the stop token when ``finish_reason == "stop"`` (the trainer trains on
    it: it is how the model learns to end a turn); nothing after it, no padding.
    ``logprobs[t]`` is the raw (temperature-1) log-probability of ``token_ids[t]``.
    ``text`` is the decoded completion without the final stop token, special tokens kept
    (``<tool_call>`` and friends must reach the env's parser).
    ``weights_version``: the version of the weights that drew it, where the policy knows one (the
    remote policy: the version its server held when the request was sent, so never newer than the
    weights that sampled); None for a policy that always samples with the current weights.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    extra: dict[str, Any] = field(default_factory=dict)
    weights_version: int | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")


@runtime_checkable
class Policy(Protocol):
    """What the rollout needs from a generator. See the module docstring for the logprob definition."""

    tokenizer: PreTrainedTokenizerBase

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """Sample one completion per prompt, the whole list in one batched call, in order."""
        ...

    def update_weights(self, model: torch.nn.Module) -> None:
        """Make generation use ``model``'s current weights (call after each optimizer step)."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory for the training phase (no-op where unsupported)."""
        ...

    def wake_up(self) -> None:
        """Undo :meth:`sleep` before the next :meth:`generate` (no-op where unsupported)."""
        ...

    def close(self) -> None:
        """Release the generator (an engine, its process group); idempotent. No :meth:`generate` after it."""
        ...


def stop_ids_for(
    tokenizer: PreTrainedTokenizerBase, generation_config: Any, params: SamplingParams
) -> list[int]:
    """The ids that end a completion: tokenizer eos, the generation config's eos ids, and ``params.stop_token_ids``."""
    ids: list[int] = []
    candidates: list[Any] = [tokenizer.eos_token_id]
    eos = getattr(generation_config, "eos_token_id", None)
    candidates.extend(eos if isinstance(eos, list | tuple) else [eos])
    candidates.extend(params.stop_token_ids)
    for token_id in candidates:
        if token_id is not None and int(token_id) not in ids:
            ids.append(int(token_id))
    return ids


def completion_text(
    tokenizer: PreTrainedTokenizerBase, token_ids: list[int], finish_reason: FinishReason
) -> str:
    """Decode a completion for the env: without its final stop token, special tokens kept."""
    body = token_ids[:-1] if finish_reason == "stop" else token_ids
    return tokenizer.decode(body, skip_special_tokens=False)


def inference_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights of ``model`` under the names of the plain Hugging Face checkpoint.

    Unwraps DDP/accelerate (``.module``) and PEFT: LoRA adapters are merged into a copy of the
    affected weights (the module itself is left unchanged), adapter tensors are dropped and the
    ``base_model.model.`` / ``.base_layer`` prefixes removed, so vLLM's ``load_weights`` or a plain
    ``load_state_dict`` accept the result.

    Example (a random in-memory Qwen3 with LoRA on ``q_proj``):
        >>> from peft import LoraConfig, get_peft_model
        >>> from transformers import Qwen3Config, Qwen3ForCausalLM
        >>> config = Qwen3Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=1, head_dim=4)
        >>> peft_model = get_peft_model(Qwen3ForCausalLM(config), LoraConfig(r=2, target_modules=["q_proj"]))
        >>> sd = inference_state_dict(peft_model)
        >>> "model.layers.0.self_attn.q_proj.weight" in sd, sorted(sd) == sorted(Qwen3ForCausalLM(config).state_dict())
        (True, True)
    """
    import torch

    while isinstance(getattr(model, "module", None), torch.nn.Module):  # DDP / accelerate wrappers
        model = model.module
    if not hasattr(model, "peft_config"):
        return dict(model.state_dict())
    return _merged_peft_state_dict(model)


def _merged_peft_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    import torch

    merged: dict[str, torch.Tensor] = {}
    lora_layers = {
        name: module for name, module in model.named_modules() if hasattr(module, "get_delta_weight")
    }
    for name, tensor in model.state_dict().items():
        # LoRA tensors are folded in below; original_module is the frozen twin of a modules_to_save copy
        if "lora_" in name or ".original_module." in name:
            continue
        layer_name = name.rsplit(".", 2)[0] if name.endswith(".base_layer.weight") else None
        clean = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        clean = clean.replace(".modules_to_save.default.", ".")
        if layer_name in lora_layers and not lora_layers[layer_name].merged:
            layer = lora_layers[layer_name]
            with torch.no_grad():
                delta = sum(
                    (
                        layer.get_delta_weight(adapter)
                        for adapter in layer.active_adapters
                        if adapter in layer.lora_A
                    ),
                    start=torch.zeros_like(tensor),
                )
                tensor = tensor + delta.to(tensor.dtype)
        merged[clean] = tensor
    return merged
