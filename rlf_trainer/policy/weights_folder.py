"""The weights a remote inference server loads: a Hugging Face folder per weights version.

:class:`~rlf_trainer.policy.remote.RemotePolicy` writes one with :func:`write_weights_folder` for
each push (``<weights_dir>/v000042``) and keeps the newest few (:func:`prune_weight_folders`).
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from rlf_trainer.policy.base import inference_state_dict

if TYPE_CHECKING:
    import torch

KEEP_FOLDERS = 2  # weight folders kept on disk: the newest, and the one before while servers switch


def write_weights_folder(
    model: torch.nn.Module, folder: str | os.PathLike[str], *, dtype: torch.dtype | None = None
) -> Path:
    """``model``'s weights as a Hugging Face folder (config + one safetensors file; LoRA merged), atomically.

    ``dtype``: floating-point tensors are written in it (None: as trained). A server that computes
    in bf16 rounds fp32 weights when it loads them anyway; writing bf16 halves the bytes each push
    writes and each server reads (the config's ``dtype`` says the folder's).

    Tied tensors are written as separate copies (``lm_head.weight`` beside the input embeddings,
    which ``save_pretrained`` leaves out): vLLM 0.32's in-place reload from a folder without the
    head keeps the old head of a model with tied embeddings (measured on the tiny Qwen3: its
    logprobs were those of the new body under the old head). Written into a temporary sibling and
    renamed, so a server never reads half a folder.

    Example (a random in-memory Qwen3 with tied embeddings):
        >>> import tempfile
        >>> import torch
        >>> from safetensors import safe_open
        >>> from transformers import Qwen3Config, Qwen3ForCausalLM
        >>> config = Qwen3Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=True)
        >>> folder = write_weights_folder(Qwen3ForCausalLM(config), Path(tempfile.mkdtemp()) / "v000001")
        >>> sorted(p.name for p in folder.iterdir())
        ['config.json', 'model.safetensors']
        >>> "lm_head.weight" in safe_open(folder / "model.safetensors", "pt").keys()
        True
        >>> half = write_weights_folder(Qwen3ForCausalLM(config), folder.parent / "v000002", dtype=torch.bfloat16)
        >>> safe_open(half / "model.safetensors", "pt").get_tensor("lm_head.weight").dtype
        torch.bfloat16
        >>> '"dtype": "bfloat16"' in (half / "config.json").read_text()
        True
    """
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    weights: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, tensor in inference_state_dict(model).items():
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensor = tensor.contiguous()
        if tensor.data_ptr() in storages:  # safetensors stores no shared tensors: a copy of its own
            tensor = tensor.clone()
        storages.add(tensor.data_ptr())
        weights[name] = tensor
    while isinstance(getattr(model, "module", None), torch.nn.Module):  # DDP / accelerate wrappers
        model = model.module
    plain = model.get_base_model() if hasattr(model, "peft_config") else model
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    config = plain.config
    if dtype is not None:  # the folder's own dtype, without touching the trained model's config
        config = copy.deepcopy(config)
        config.dtype = dtype
    config.save_pretrained(tmp)
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def prune_weight_folders(weights_dir: Path, keep: Path) -> None:
    """Delete older version folders, keeping ``keep`` and the newest others up to :data:`KEEP_FOLDERS`."""
    folders = sorted(p for p in weights_dir.glob("v*") if p.is_dir() and p != keep)
    for old in folders[: max(0, len(folders) - (KEEP_FOLDERS - 1))]:
        shutil.rmtree(old, ignore_errors=True)


__all__ = ["KEEP_FOLDERS", "prune_weight_folders", "write_weights_folder"]
