"""RemotePolicy over real rlf-serve processes on 127.0.0.1 (tiny Qwen3): token-exact completions,
weight pushes, version tags, least-in-flight balancing, failover and clear failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rlf_trainer.policy.base import SamplingParams
from rlf_trainer.policy.remote import NoServerAnswered, RemotePolicy, RemoteRequestRefused, WeightPushFailed
from tests.helpers import LOGPROB_ATOL, forward_logprobs, free_local_port, rlf_serve

pytestmark = pytest.mark.timeout(300)

# One seeded sample must not depend on what the server generated before (its HF key/value store).
SERVE_ARGS = ("--prefix-cache-tokens", "0", "--batch-wait-ms", "5")
PROMPTS = [[5, 17, 230, 99, 4], [8, 9, 10], [300, 301, 302, 303]]


@pytest.fixture(scope="module")
def two_servers(shared_tiny_model_dir: Path) -> Iterator[list[str]]:
    with (
        rlf_serve(shared_tiny_model_dir, *SERVE_ARGS) as (a, _),
        rlf_serve(shared_tiny_model_dir, *SERVE_ARGS) as (b, _),
    ):
        yield [a, b]


@pytest.fixture
def policy(two_servers: list[str], tiny_tokenizer: Any, tmp_path: Path) -> Iterator[RemotePolicy]:
    remote = RemotePolicy(two_servers, tiny_tokenizer, weights_dir=tmp_path / "weights", request_timeout_s=60)
    yield remote
    remote.close()


def _model(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def test_completions_are_the_sampled_ids_with_their_raw_logprobs(policy: RemotePolicy, shared_tiny_model_dir: Path) -> None:  # fmt: skip
    params = SamplingParams(max_new_tokens=12, temperature=0.9, seeds=(1, 2, 3))
    completions = policy.generate(PROMPTS, params)
    model = _model(shared_tiny_model_dir)
    for prompt, completion in zip(PROMPTS, completions, strict=True):
        assert 1 <= len(completion.token_ids) == len(completion.logprobs) <= 12
        expected = forward_logprobs(model, prompt, completion.token_ids).tolist()
        assert completion.logprobs == pytest.approx(expected, abs=LOGPROB_ATOL)
        assert completion.weights_version == 0 and completion.finish_reason in ("stop", "length")
    again = policy.generate(PROMPTS, params)  # per-request seeds: the same samples, whichever server
    assert [c.token_ids for c in again] == [c.token_ids for c in completions]
    metrics = policy.take_metrics()
    assert metrics["remote/servers_up"] == 2 and metrics["remote/failovers"] == 0
    # both servers got requests (least-in-flight spreads them); tokens/s is a figure, not checked
    assert metrics["remote/server0/in_flight_peak"] >= 1 and metrics["remote/server1/in_flight_peak"] >= 1
    assert {"remote/server0/tokens_per_s", "remote/server1/tokens_per_s"} <= set(metrics)


def test_requests_go_to_the_server_with_the_fewest_in_flight(policy: RemotePolicy) -> None:
    completions = policy.generate(PROMPTS * 4, SamplingParams(max_new_tokens=4, seed=0))
    servers = [c.extra["server"] for c in completions]
    assert abs(servers.count(policy.pool.servers[0].url) - servers.count(policy.pool.servers[1].url)) <= 1


def test_pushed_weights_are_served_and_tag_the_samples(policy: RemotePolicy, shared_tiny_model_dir: Path) -> None:  # fmt: skip
    import torch

    model = _model(shared_tiny_model_dir)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.3)
    try:
        policy.update_weights(model, version=4)
        [completion] = policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=8, seed=5))
        assert completion.weights_version == 4 and policy.version == 4
        expected = forward_logprobs(model, PROMPTS[0], completion.token_ids).tolist()
        assert completion.logprobs == pytest.approx(expected, abs=LOGPROB_ATOL)
        assert sorted(p.name for p in policy.weights_dir.iterdir()) == ["v000004"]
        policy.refresh_versions()  # what another rank asks: the servers say it too
        assert [s.version for s in policy.pool.servers] == [4, 4]
    finally:
        policy.update_weights(
            _model(shared_tiny_model_dir), version=5
        )  # the module's servers back to the original
    assert sorted(p.name for p in policy.weights_dir.iterdir()) == ["v000004", "v000005"]


def test_a_server_killed_mid_rollout_sends_its_requests_to_the_other(
    shared_tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    with rlf_serve(shared_tiny_model_dir, *SERVE_ARGS) as (a, doomed), rlf_serve(shared_tiny_model_dir, *SERVE_ARGS) as (b, _):  # fmt: skip
        policy = RemotePolicy([a, b], tiny_tokenizer, weights_dir=tmp_path, request_timeout_s=60)
        try:
            killer = threading.Timer(0.5, doomed.kill)  # while the 24 requests below are in flight
            killer.start()
            completions = policy.generate(PROMPTS * 8, SamplingParams(max_new_tokens=48, seed=0))
            killer.join()
            assert doomed.wait(timeout=10) is not None
            assert all(len(c.token_ids) == len(c.logprobs) >= 1 for c in completions)
            metrics = policy.take_metrics()
            assert metrics["remote/failovers"] >= 1 and metrics["remote/servers_up"] == 1
            assert policy.generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=1))[0].extra["server"] == b.removesuffix("/v1")  # fmt: skip
        finally:
            policy.close()


def test_no_server_left_fails_the_call_with_every_servers_error(tiny_tokenizer: Any, tmp_path: Path) -> None:
    dead = [f"http://127.0.0.1:{free_local_port()}", f"http://127.0.0.1:{free_local_port()}/v1"]
    policy = RemotePolicy(dead, tiny_tokenizer, weights_dir=tmp_path, request_timeout_s=5, max_attempts=3)
    started = time.monotonic()
    try:
        with pytest.raises(NoServerAnswered, match=r"after 3 tries: http://127\.0\.0\.1:\d+: Client"):
            policy.generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=0))
        with pytest.raises(WeightPushFailed, match="no server took weights version 1"):
            policy.push_folder(tmp_path, 1)
    finally:
        policy.close()
    assert time.monotonic() - started < 30


def test_a_server_without_the_routes_is_named_with_the_fix(openai_server: Any, tiny_tokenizer: Any, tmp_path: Path) -> None:  # fmt: skip
    """The scripted OpenAI server has chat completions only, like vLLM without dev mode has no /pause."""
    policy = RemotePolicy([openai_server.url], tiny_tokenizer, weights_dir=tmp_path, request_timeout_s=5)
    try:
        with pytest.raises(RemoteRequestRefused, match="HTTP 404"):
            policy.generate(PROMPTS[:1], SamplingParams(max_new_tokens=4, seed=0))
        with pytest.raises(WeightPushFailed, match="VLLM_SERVER_DEV_MODE=1"):
            policy.push_folder(tmp_path, 1)
    finally:
        policy.close()
