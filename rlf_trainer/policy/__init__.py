"""Policies: batched generators that return token ids and their raw log-probabilities.

``HFPolicy`` (transformers, CPU and tests) is imported here; ``VLLMPolicy`` is imported on first
attribute access so that ``import rlf_trainer.policy`` never imports vLLM (it only needs vLLM once
you construct one).

Example:
    >>> from rlf_trainer.policy import HFPolicy, SamplingParams, VLLMPolicy  # no vllm import yet
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlf_trainer.policy.base import Completion, FinishReason, Policy, SamplingParams, inference_state_dict
from rlf_trainer.policy.hf import HFPolicy

if TYPE_CHECKING:
    from rlf_trainer.policy.vllm import VLLMPolicy

__all__ = [
    "Completion",
    "FinishReason",
    "HFPolicy",
    "Policy",
    "SamplingParams",
    "VLLMPolicy",
    "inference_state_dict",
]


def __getattr__(name: str) -> Any:
    if name == "VLLMPolicy":
        from rlf_trainer.policy.vllm import VLLMPolicy

        return VLLMPolicy
    raise AttributeError(f"module 'rlf_trainer.policy' has no attribute {name!r}")
