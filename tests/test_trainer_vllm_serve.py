"""The remote policy and the trainer against a real ``vllm serve`` process (tiny Qwen3, float32, CPU).

Needs vLLM (skipped otherwise); on CPU that is the ``.venv-vllm`` of ``scripts/install_vllm_cpu.sh``::

    .venv-vllm/bin/python -m pytest -m vllm tests/test_trainer_vllm_serve.py -q

The same client code as against rlf-serve: token-id completions with logprobs, and the weight push
through vLLM's dev-mode routes (``VLLM_SERVER_DEV_MODE=1``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlf_trainer.policy.base import SamplingParams
from rlf_trainer.policy.remote import RemotePolicy
from rlf_trainer.trainer import Trainer
from tests.helpers import LOGPROB_ATOL, REPO, forward_logprobs, free_local_port, tiny_config, wait_for_port

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
    pytest.mark.timeout(1200),
]

PROMPTS = [[5, 17, 230, 99, 4], [8, 9, 10]]


@contextlib.contextmanager
def vllm_serve(model_dir: Path) -> Iterator[str]:
    """``vllm serve`` on a free port with its weight-update routes on; yields the base URL.

    On CPU: whole prefills (seeded requests crash vLLM's CPU runner after a partial one) and
    32-token KV blocks, as :class:`~rlf_trainer.policy.vllm.VLLMPolicy` sets them.
    """
    port = free_local_port()
    # `vllm serve` itself, started as a module: the CPU venv's vllm has no package metadata, which
    # the `vllm` console script reads for --version
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
               "--no-enable-chunked-prefill", "--block-size", "32"]  # fmt: skip
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
        try:
            try:
                wait_for_port(port, process, 600)
                _wait_healthy(f"http://127.0.0.1:{port}", process)
            except (RuntimeError, TimeoutError):
                log.seek(0)
                raise RuntimeError(
                    f"vllm serve did not start:\n{log.read().decode(errors='replace')[-4000:]}"
                ) from None
            yield f"http://127.0.0.1:{port}"
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)


def _wait_healthy(root: str, process: subprocess.Popen[bytes]) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("vllm serve exited")
        with contextlib.suppress(OSError):
            if urllib.request.urlopen(f"{root}/health", timeout=5).status == 200:
                return
        time.sleep(1)
    raise TimeoutError("vllm serve never became healthy")


@pytest.fixture(scope="module")
def server(shared_tiny_model_dir: Path) -> Iterator[str]:
    with vllm_serve(shared_tiny_model_dir) as url:
        yield url


def _model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def test_vllm_serve_samples_token_exactly_and_takes_pushed_weights(
    server: str, shared_tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    import torch

    policy = RemotePolicy([server], tiny_tokenizer, weights_dir=tmp_path, request_timeout_s=120)
    try:
        params = SamplingParams(max_new_tokens=12, temperature=0.9, seeds=(1, 2))
        completions = policy.generate(PROMPTS, params)
        model = _model(shared_tiny_model_dir)
        for prompt, completion in zip(PROMPTS, completions, strict=True):
            assert len(completion.token_ids) == len(completion.logprobs) >= 1
            expected = forward_logprobs(model, prompt, completion.token_ids).tolist()
            assert completion.logprobs == pytest.approx(expected, abs=LOGPROB_ATOL)
        assert [c.token_ids for c in policy.generate(PROMPTS, params)] == [c.token_ids for c in completions]

        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.3)
        policy.update_weights(model, version=1)
        [completion] = policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, seed=5))
        assert completion.weights_version == 1
        expected = forward_logprobs(model, PROMPTS[0], completion.token_ids).tolist()
        assert completion.logprobs == pytest.approx(expected, abs=LOGPROB_ATOL)
        policy.refresh_versions()
        assert policy.pool.servers[0].version == 1
    finally:
        policy.push_folder(shared_tiny_model_dir, 0)  # the original weights for the next test
        policy.close()


def test_weights_pushed_in_bf16_are_served_as_rounded(
    server: str, shared_tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    import torch

    policy = RemotePolicy([server], tiny_tokenizer, weights_dir=tmp_path, push_dtype=torch.bfloat16)
    try:
        model = _model(shared_tiny_model_dir)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.3)
        policy.update_weights(model, version=1)
        [completion] = policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, seed=5))
        rounded = model.to(torch.bfloat16).to(torch.float32)  # the fp32 server computes on these
        expected = forward_logprobs(rounded, PROMPTS[0], completion.token_ids).tolist()
        assert completion.logprobs == pytest.approx(expected, abs=LOGPROB_ATOL)
    finally:
        policy.push_folder(shared_tiny_model_dir, 0)
        policy.close()


def test_the_trainer_keeps_vllm_serve_on_the_trained_weights(
    server: str, shared_tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = tiny_config(
        shared_tiny_model_dir,
        tmp_path,
        "policy.backend=remote",
        f"policy.remote.urls={json.dumps([server])}",
        "max_steps=3",
        "eval.every=0",
        "checkpoint.every=0",
        "checkpoint.save_model=false",
    )
    records = Trainer(config).train().records
    assert all(r["grad_norm"] > 0 for r in records)
    assert all(r["sampler_kl"] < 1e-3 for r in records[1:]), [r["sampler_kl"] for r in records]
    assert all(r["rollout/staleness"] == 0 for r in records)
