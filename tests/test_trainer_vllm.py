"""Trainer with ``policy.backend=vllm``: the tiny Qwen3 trained with a colocated vLLM engine.

Needs vLLM (skipped otherwise); on CPU that is the ``.venv-vllm`` of ``scripts/install_vllm_cpu.sh``::

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m pytest -m vllm tests/test_trainer_vllm.py -q

The point is the weight push: after an optimizer step the engine must sample from the *trained*
weights, not from the checkpoint it was started with; and the run must end cleanly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest
import torch

from rlf_trainer.policy import SamplingParams
from rlf_trainer.trainer import Trainer
from tests.helpers import (
    LOGPROB_ATOL,
    REPO,
    forward_logprobs,
    model_params,
    text_reward,
    tiny_config,
    train_py_command,
)

ENGINE = (
    "policy.backend=vllm",
    "policy.vllm.dtype=float32",
    "policy.vllm.max_model_len=1024",
    "policy.vllm.gpu_memory_utilization=0.3",
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


@pytest.fixture(scope="module")
def stepped(tiny_model_dir, tmp_path_factory):
    """Two train steps, then the engine sampled and scored against trained and initial weights, then close()."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rlf_trainer.rollout.chat import prompt_ids

    config = tiny_config(tiny_model_dir, tmp_path_factory.mktemp("runs"), "logging.run_name=vllm", *ENGINE)
    trainer = Trainer(config)
    records = [trainer.train_step(), trainer.train_step()]
    prompts = [
        prompt_ids(trainer.tokenizer, [{"role": "user", "content": "Who founded Velmora Works?"}]),
        [5, 6, 7],
    ]
    completions = trainer.policy.generate(prompts, SamplingParams(max_new_tokens=12, seed=4))
    trained = trainer.accelerator.unwrap_model(trainer.model).float().eval()
    scored = [
        (c, forward_logprobs(trained, p, c.token_ids), p) for p, c in zip(prompts, completions, strict=True)
    ]
    trained_params = model_params(trainer)
    trainer.close()
    yield {"trainer": trainer, "records": records, "scored": scored, "trained_params": trained_params}


def test_each_step_samples_with_the_weights_being_trained(stepped):
    first, second = stepped["records"]
    assert first["grad_norm"] > 0 and second["grad_norm"] > 0
    # async rollout: time/generate sums the episodes' busy seconds (they overlap); the wall is time/rollout
    assert 0 < first["time/rollout"] <= first["time/step"] and first["time/generate"] > 0
    assert first["response_length"] > 0
    # sampler_kl: KL(engine's sampling distribution || training model) on the sampled tokens. At step 2
    # it is ~0 only if step 1's update reached the engine (a stale engine gives > 1e-3 here).
    assert first["sampler_kl"] < 1e-5 and second["sampler_kl"] < 1e-5, (
        first["sampler_kl"],
        second["sampler_kl"],
    )


def test_the_engine_holds_the_trained_weights(stepped, tiny_model):
    moved = max(
        float((stepped["trained_params"][name] - value).abs().max())
        for name, value in tiny_model.state_dict().items()
    )
    assert moved > 1e-4, "training did not change the weights"
    stale = 0.0
    for completion, trained_logprobs, prompt in stepped["scored"]:
        from_engine = torch.tensor(completion.logprobs)
        assert torch.allclose(from_engine, trained_logprobs, atol=LOGPROB_ATOL)
        initial = forward_logprobs(tiny_model, prompt, completion.token_ids)
        stale = max(stale, float((from_engine - initial).abs().max()))
    assert stale > 10 * LOGPROB_ATOL, (
        "the engine's logprobs also fit the untrained weights: the check is void"
    )


def test_close_shuts_the_engine_down(stepped):
    policy = stepped["trainer"].policy
    assert policy.closed
    with pytest.raises(RuntimeError, match="after close"):
        policy.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))
    policy.close()  # idempotent


def test_train_py_with_the_vllm_backend_and_lora_runs_evaluates_and_exits_cleanly(tiny_model_dir, tmp_path):
    """With LoRA the engine gets the merged weights: sampler_kl ~0 at step 2 shows they arrived.

    The reward is the tests' text_reward (by import string, as a YAML config would name it): with
    the ToolUse f1 reward the random model scores 0 everywhere and no step would change anything.
    (Full fine-tuning takes the same path without the merge: ``stepped`` above in this process, and
    tests/test_distributed_vllm.py through launchers with an engine per rank.)
    """
    lora = ("lora.enabled=true", "lora.r=4", "lora.target_modules=[q_proj, v_proj]", "optim.lr=0.02")
    command = train_py_command(
        tiny_model_dir, tmp_path, "logging.progress_bar=false", "checkpoint.every=0",
        "env.import_kwargs.reward=tests.helpers:text_reward", *ENGINE, *lora,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}  # fmt: skip
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    metrics = [
        json.loads(line) for line in (tmp_path / "tiny_test" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2] and "eval/reward" in metrics[-1]
    # Step 1 moved the policy away from the reference (kl) by enough that a stale engine would show
    # it: measured without the weight push, sampler_kl at step 2 is 1.3e-2 here (7e-3 without LoRA).
    assert metrics[-1]["kl"] > 1e-3, metrics[-1]["kl"]
    assert metrics[-1]["sampler_kl"] < 1e-5, metrics[-1]["sampler_kl"]


def codebook_config(tiny_model_dir, run_dir, *overrides):
    """The tiny model on RLF/Codebook-v0 with the vLLM engine; text_reward gives a random model signal."""
    config = tiny_config(
        tiny_model_dir, run_dir, "eval.every=0", "checkpoint.every=0", "checkpoint.save_final=false",
        "checkpoint.save_model=false", *ENGINE, *overrides,
    )  # fmt: skip
    config.env.id = "RLF/Codebook-v0"
    config.env.kwargs = {"reward": text_reward}  # the codebook's own questions, tool and prompt
    return config.validate()


def test_async_rollout_trains_five_steps_with_the_engine_in_sync(tiny_model_dir, tmp_path):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    config = codebook_config(tiny_model_dir, tmp_path, "rollout.mode=async", "max_steps=5")
    assert config.rollout.mode == "async"
    history = Trainer(config).train()
    records = history.records
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert all(r["grad_norm"] > 0 for r in records)
    # after every weight sync the engine samples from the weights being trained
    assert all(r["sampler_kl"] < 1e-3 for r in records), [r["sampler_kl"] for r in records]
    assert all(r["rollout/staleness"] == 0 for r in records)
    assert records[-1]["kl"] > 1e-4  # the policy did move, so a stale engine would have shown


def test_overlap_samples_one_version_behind_and_corrects_for_it(tiny_model_dir, tmp_path):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    config = codebook_config(tiny_model_dir, tmp_path, "rollout.overlap=true", "max_steps=3")
    assert config.algorithm.tis_cap == 2.0  # truncated importance sampling is on by default under overlap
    records = Trainer(config).train().records
    # step 1 samples on-policy; steps 2 and 3 were rolled out while the step before trained
    assert [r["rollout/staleness"] for r in records] == [0.0, 1.0, 1.0]
    assert all("tis/weight_mean" in r and 0 <= r["tis/capped_fraction"] <= 1 for r in records)
    assert records[0]["sampler_kl"] < 1e-3
    # one version behind: the sampler differs from the trained policy by the last update
    assert records[2]["sampler_kl"] > records[0]["sampler_kl"]
