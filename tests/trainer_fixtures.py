"""Shared trainer-test fixtures: a tiny random Qwen3 built once per test session.

Import the fixtures into a test module (pytest finds them by name)::

    from tests.trainer_fixtures import tiny_model, tiny_model_dir, tiny_tokenizer  # noqa: F401

Outside pytest (e.g. a vLLM subprocess), call :func:`build_tiny_model` with a folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlf_trainer.models import build_tiny_qwen3

TINY_MODEL_KWARGS: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "head_dim": 32,
    "seed": 0,
}


def build_tiny_model(root: str | Path) -> Path:
    """The tiny Qwen3 every trainer test uses, built (or reused) under ``root``."""
    return build_tiny_qwen3(Path(root) / "tiny-qwen3", **TINY_MODEL_KWARGS)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of the tiny Qwen3 (config, safetensors, tokenizer with chat template)."""
    return build_tiny_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def tiny_model(tiny_model_dir: Path) -> Any:
    """A fresh float32 copy of the tiny model per test (tests may change its weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


@pytest.fixture
def prompts(tiny_tokenizer: Any) -> list[list[int]]:
    """Three prompts of different lengths, so left padding is exercised."""
    from rlf_trainer.chat import prompt_ids

    return [
        prompt_ids(tiny_tokenizer, [{"role": "user", "content": "Who founded Velmora Works?"}]),
        prompt_ids(tiny_tokenizer, [{"role": "user", "content": "hi"}]),
        [5, 6, 7],
    ]


def forward_logprobs(model: Any, prompt: list[int], completion: list[int]) -> Any:
    """Raw log p(completion_t | prompt + completion_<t) from one unpadded forward pass."""
    import torch

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)
