"""The trainer with ``policy.backend: remote`` against real rlf-serve processes on 127.0.0.1 (tiny
Qwen3): the weight push keeps the servers on the trained weights, samples carry the version that
drew them, staleness stays within ``rollout.max_staleness``, a dead server is failed over or fails
the run clearly, and a resume at staleness 0 is exact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from rlf_trainer.policy.remote import RemotePolicy, RemotePolicyError
from rlf_trainer.run.checkpoint import list_checkpoints
from rlf_trainer.trainer import Trainer
from tests.helpers import model_params, rlf_serve, tiny_config

pytestmark = pytest.mark.timeout(600)

SERVE_ARGS = ("--prefix-cache-tokens", "0", "--batch-wait-ms", "5")


@pytest.fixture(scope="module")
def server(shared_tiny_model_dir: Path) -> Iterator[str]:
    with rlf_serve(shared_tiny_model_dir, *SERVE_ARGS) as (url, _):
        yield url


def remote_config(model_dir: Path, run_dir: Path, urls: list[str], *overrides: str) -> Any:
    """tiny_config on the remote backend: 3 steps, no eval, every episode in train_samples.jsonl."""
    return tiny_config(
        model_dir,
        run_dir,
        "policy.backend=remote",
        f"policy.remote.urls={json.dumps(urls)}",
        "policy.remote.request_timeout_s=60",
        "max_steps=3",
        "eval.every=0",
        "checkpoint.every=0",
        "checkpoint.save_model=false",
        "logging.samples_per_step=8",
        *overrides,
    )


def step_samples(trainer: Trainer) -> dict[int, list[dict[str, Any]]]:
    by_step: dict[int, list[dict[str, Any]]] = {}
    for line in (trainer.run_dir / "train_samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], []).append(record)
    return by_step


def reset_server(url: str, model_dir: Path, tokenizer: Any) -> None:
    """Serve the original weights again (as version 0): tests that push nothing start from them."""
    policy = RemotePolicy([url], tokenizer)
    try:
        policy.push_folder(model_dir, 0)
    finally:
        policy.close()


def test_each_step_samples_with_the_weights_being_trained(server: str, shared_tiny_model_dir: Path, tmp_path: Path) -> None:  # fmt: skip
    trainer = Trainer(remote_config(shared_tiny_model_dir, tmp_path, [server]))
    history = trainer.train()
    records = history.records
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["grad_norm"] > 0 for r in records), "the weights must move, or the check proves nothing"
    for record in records[1:]:  # step 1 samples the weights pushed at the start: the same
        assert record["sampler_kl"] < 1e-3, record
    assert all(r["rollout/staleness"] == 0 and r["rollout/dropped_stale"] == 0 for r in records)
    assert all(r["remote/servers_up"] == 1 and r["remote/server0/in_flight_peak"] >= 1 for r in records)
    # every sample of step k (1-based) was drawn by the weights of k-1 optimizer steps
    assert {
        step: {s["weights_version"] for s in samples} for step, samples in step_samples(trainer).items()
    } == {
        1: {0},
        2: {1},
        3: {2},
    }


def test_a_server_left_stale_shows_in_sampler_kl(
    server: str, shared_tiny_model_dir: Path, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    """sync_every=0 never pushes: the server keeps the weights it started with, and every step's
    samples are a version older than the last (kept here: max_staleness above the run's length)."""
    reset_server(server, shared_tiny_model_dir, tiny_tokenizer)
    config = remote_config(
        shared_tiny_model_dir, tmp_path, [server], "policy.remote.sync_every=0", "rollout.max_staleness=5"
    )
    history = Trainer(config).train()
    records = history.records
    assert records[0]["sampler_kl"] < 1e-3  # nothing trained yet
    assert all(r["sampler_kl"] > 1e-3 for r in records[1:]), [r["sampler_kl"] for r in records]
    assert [r["rollout/staleness"] for r in records] == [0, 1, 2]


def test_staleness_stays_within_the_bound_while_rollouts_overlap_the_update(
    server: str, shared_tiny_model_dir: Path, tmp_path: Path
) -> None:
    """max_staleness=1: the next step's rollout runs while this step trains and pushes its weights."""
    trainer = Trainer(remote_config(shared_tiny_model_dir, tmp_path, [server], "rollout.max_staleness=1", "max_steps=4"))  # fmt: skip
    assert trainer.prefetch is not None and trainer.config.algorithm.tis_cap == 2.0
    records = trainer.train().records
    assert all(0 <= r["rollout/staleness"] <= 1 and r["rollout/dropped_stale"] == 0 for r in records)
    assert records[0]["rollout/staleness"] == 0 and max(r["rollout/staleness"] for r in records[1:]) == 1
    assert all("tis/weight_mean" in r for r in records)
    for step, samples in step_samples(trainer).items():
        assert all(step - 2 <= s["weights_version"] <= step - 1 for s in samples), (step, samples)


def test_pushing_every_other_step_tags_and_drops_by_version(
    server: str, shared_tiny_model_dir: Path, tmp_path: Path
) -> None:
    """sync_every=2: the servers hold versions 0, 0, 2, 2; with max_staleness=0 (not allowed by the
    config: it would drop every other step) the trainer refuses, with max_staleness=1 all train."""
    from rlf_trainer.config import ConfigError

    with pytest.raises(ConfigError, match="sync_every=2 leaves the servers up to 1 versions behind"):
        remote_config(shared_tiny_model_dir, tmp_path, [server], "policy.remote.sync_every=2")
    config = remote_config(
        shared_tiny_model_dir, tmp_path, [server], "policy.remote.sync_every=2", "rollout.max_staleness=1", "max_steps=4"
    )  # fmt: skip
    trainer = Trainer(config)
    assert trainer.prefetch is None  # the servers' own lag already uses the bound
    records = trainer.train().records
    versions = {
        step: {s["weights_version"] for s in samples} for step, samples in step_samples(trainer).items()
    }
    assert versions == {1: {0}, 2: {0}, 3: {2}, 4: {2}}
    assert [r["rollout/staleness"] for r in records] == [0, 1, 0, 1]
    assert [r["sampler_kl"] < 1e-3 for r in records] == [True, False, True, False]


def kill_after_first_step(trainer: Trainer, server: Any) -> None:
    """Kill ``server`` once step 1 has pushed its weights: step 2's rollout meets a dead server.

    At a set point, not on a timer: a timer could fire after a fast run had already ended.
    """
    run_step = trainer.train_step

    def step_then_kill() -> dict[str, float]:
        metrics = run_step()
        if trainer.step == 1:
            server.kill()
            server.wait(timeout=30)
        return metrics

    trainer.train_step = step_then_kill  # type: ignore[method-assign]


def test_a_dead_server_is_failed_over_and_a_lone_one_fails_the_run_clearly(
    shared_tiny_model_dir: Path, tmp_path: Path
) -> None:
    with rlf_serve(shared_tiny_model_dir, *SERVE_ARGS) as (a, doomed), rlf_serve(shared_tiny_model_dir, *SERVE_ARGS) as (b, survivor):  # fmt: skip
        config = remote_config(
            shared_tiny_model_dir, tmp_path / "two", [a, b], "policy.remote.max_attempts=4"
        )
        trainer = Trainer(config)
        kill_after_first_step(trainer, doomed)
        records = trainer.train().records
        assert [r["step"] for r in records] == [1, 2, 3]
        # step 2's requests to the dead server fail over to the survivor and the pool marks it down
        # (tests/test_remote_policy.py kills one with requests in flight)
        assert [r["remote/servers_up"] for r in records] == [2, 1, 1]
        assert trainer.policy.pool.servers[0].last_error
        assert all(r["sampler_kl"] < 1e-3 for r in records[1:])  # the survivor had every push

        config = remote_config(shared_tiny_model_dir, tmp_path / "one", [b], "policy.remote.max_attempts=2")
        lone = Trainer(config)
        kill_after_first_step(lone, survivor)
        with pytest.raises(RemotePolicyError, match=r"no inference server answered|no server took weights"):
            lone.train()


def test_resume_at_staleness_zero_reproduces_the_step_exactly(
    server: str, shared_tiny_model_dir: Path, tmp_path: Path
) -> None:
    straight = Trainer(remote_config(shared_tiny_model_dir, tmp_path, [server], "max_steps=2", "checkpoint.every=1"))  # fmt: skip
    straight_history = straight.train()
    straight_params = model_params(straight)
    first = list_checkpoints(straight.config.checkpoint_dir)[0]

    config = remote_config(
        shared_tiny_model_dir,
        tmp_path,
        [server],
        "max_steps=2",
        "logging.run_name=resumed",
        f"checkpoint.resume={first}",
    )
    resumed = Trainer(config)
    assert resumed.step == 1
    history = resumed.train()
    a, b = straight.last_batch, resumed.last_batch
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
    assert [s.weights_version for s in b.stats] == [1] * len(b.stats)
    for key in ("loss", "grad_norm", "reward/mean", "kl", "sampler_kl"):
        assert history.records[-1][key] == pytest.approx(straight_history.records[-1][key], abs=1e-6), key
    for name, value in model_params(resumed).items():
        assert torch.allclose(value, straight_params[name], atol=1e-6, rtol=0), name
