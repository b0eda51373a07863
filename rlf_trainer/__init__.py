"""RLF trainer half: GRPO-family losses, policies (Hugging Face, vLLM), offline models, chat helpers.

Imports torch, transformers and accelerate (vLLM only inside :mod:`rlf_trainer.policy.vllm`, lazily);
uses :mod:`rlf_envs` only through the Gymnasium API. Submodules are imported on demand so that
``rlf-models`` and ``import rlf_trainer.algorithms.losses`` stay light:

    >>> from rlf_trainer.algorithms.advantages import turn_advantages
    >>> from rlf_trainer.algorithms.losses import policy_loss
    >>> from rlf_trainer.policy import HFPolicy, SamplingParams
    >>> from rlf_trainer.data.models import build_tiny_qwen3, prepare_smollm2
    >>> from rlf_trainer.rollout.chat import prompt_ids, tool_delta_ids
"""
