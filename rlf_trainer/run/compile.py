"""``compile: true``: the update's forward and backward through ``torch.compile``, one decoder layer at a time.

On a CPU the update spends much of its time outside the matmuls: RMSNorm, rotary embeddings,
SiLU x gate, residual adds and autocast's dtype casts run as separate memory-bound passes.
Inductor fuses them into a few C++ loops per layer (the DeepSearch recipe's GRPO update, bf16,
2 threads, one sitting: 23.4 s eager, 20.1 s compiled; docs/benchmarks.md).

Regional compilation (PyTorch's recipe): each decoder layer is compiled in place with
``nn.Module.compile``; the layers share one class and one code object, so Inductor compiles once
(dynamic shapes: every batch width reuses it) and the first step pays ~15-20 s. The model keeps
its parameters, state-dict keys and wrappers (DDP, PEFT), so checkpoints, weight syncs and saved
folders are unchanged. Sampling never goes through the compiled code: the HF policy decodes
under ``torch.compiler.set_stance("force_eager")`` (one token at a time against a KV cache would
recompile and gain nothing), and its bf16 copy is made before the layers are compiled.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import torch


class CompileError(ValueError):
    """``compile: true`` cannot work here: no C++ compiler, or no repeated decoder layers."""


def check_compiler() -> None:
    """Raise :class:`CompileError` unless Inductor's C++ compiler is on the PATH (``$CXX``, else
    ``g++`` or ``clang++``): without one the first step would fail deep inside Inductor."""
    named = os.environ.get("CXX")
    if not (shutil.which(named) if named else shutil.which("g++") or shutil.which("clang++")):
        wanted = f"$CXX ({named})" if named else "g++ or clang++"
        raise CompileError(
            f"compile: true needs a C++ compiler for torch.compile's CPU code and found no {wanted} on the "
            "PATH: install one (apt-get install g++) or set compile: false"
        )


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The repeated blocks of a causal LM (under PEFT's wrapper too): its decoder's ``layers``."""
    core = model.get_base_model() if hasattr(model, "peft_config") else model
    get_decoder = getattr(core, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if callable(get_decoder) else None
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise CompileError(
            f"compile: true needs a decoder with a `layers` list (Hugging Face causal LMs have one); "
            f"{type(core).__name__} has none: set compile: false"
        )
    return layers


def compile_decoder_layers(model: Any) -> int:
    """Compile each decoder layer of ``model`` in place (Inductor, dynamic shapes); the count.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> tiny = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    >>> compile_decoder_layers(tiny)
    2
    >>> sorted(tiny.state_dict()) == sorted(LlamaForCausalLM(tiny.config).state_dict())
    True
    """
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(backend="inductor", dynamic=True)
    return len(layers)
