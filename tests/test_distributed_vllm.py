"""The trainer with ``policy.backend=vllm`` as 2 CPU processes (gloo), one vLLM CPU engine per rank.

Needs vLLM (the vllm group; on a CPU the ``.venv-vllm`` of scripts/install_vllm_cpu.sh). The checks
tests/test_distributed.py makes of the HF backend, in four launches (each starts two engines, about
a minute on a 2-core CPU), every one through tests/dist_scripts/train_and_record.py:

- ``torchrun``, lockstep rollout, 3 steps, a checkpoint after each, eval at step 2: the ranks play
  disjoint episodes that make up each step, seeded as one process would seed them; ``sampler_kl``
  ~0 at every step (each rank's engine got every weight push); both ranks hold the same weights and
  the exported model is them;
- ``torchrun`` resumed from that run's step-2 checkpoint: step 3 again, the same plays, metrics and
  weights;
- ``accelerate launch`` with multi_cpu.yaml, async rollout with ``rollout.overlap``, eval at step 2:
  step 2 is rolled out during step 1's update (one version stale: ``sampler_kl`` > 0 and TIS on),
  steps 1 and 3 after a push (``sampler_kl`` ~0), the ranks disjoint again;
- ``torchrun``, lockstep, rank 1 SIGKILLed in an env step: every rank ends and the launch fails.

How the engines share the launch's process group: ``VLLMPolicy`` runs vLLM's engine core in the
training process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``); vLLM's worker then finds torch.distributed
already initialised by Accelerate, keeps that 2-rank group as its world and lays its own tensor- and
pipeline-parallel groups of size 1 inside it (its "external data parallel" layout, the one verl's
colocated engines use), so each rank's engine generates alone and no collective of vLLM's crosses ranks.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import (
    REPO,
    accelerate_launch,
    faulty,
    launch,
    launch_with_fault,
    max_diff,
    ranks,
    record,
    same_metrics,
    tiny_model_path,
    torchrun,
    train_py,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

ENGINE = ("policy.backend=vllm", "policy.vllm.dtype=float32", "policy.vllm.max_model_len=1024")
ON_POLICY_KL = 1e-5  # sampler_kl of a rollout sampled after the push (a stale engine: ~7e-3 here)


@pytest.fixture(scope="module", autouse=True)
def _kv_cache_size() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB per engine; the launches inherit it


def train_plays(rank: dict[str, Any]) -> list[dict[str, Any]]:
    """A rank's training rollouts in the order it played them: step k is the k-th (no refill rounds).

    (An overlapped rollout is recorded during the step before its own, so its ``step`` says that one.)
    """
    return [p for p in rank["plays"] if p["split"] == "train"]


def check_disjoint_plays(rank0: dict[str, Any], rank1: dict[str, Any], steps: int, *, lockstep: bool) -> None:
    """Every step's prompts are split between the ranks (a group stays on one) and each episode is
    seeded as a one-process run seeds it; the test split is split too; no request seed is used twice."""
    from rlf_trainer.prompts import PromptSampler
    from rlf_trainer.seeds import sample_seed

    assert rank0["world"] == rank1["world"] == 2
    sampler = PromptSampler(num_tasks=4, seed=0)
    plays0, plays1 = train_plays(rank0), train_plays(rank1)
    assert len(plays0) == len(plays1) == steps
    for step, (a, b) in enumerate(zip(plays0, plays1, strict=True)):
        assert not set(a["tasks"]) & set(b["tasks"]), (a, b)
        assert sorted(a["tasks"] + b["tasks"]) == sorted(sampler.indices(step, 2) * 2)
        first_turn = [sample_seed(0, step=step, episode=e, turn=0) for e in range(4)]
        if lockstep:  # one batched generate a turn: its seeds are the episodes' in order
            assert a["seeds"] + b["seeds"] == first_turn
        else:  # one request at a time, in whatever order the episodes get there
            assert set(first_turn[:2]) <= set(a["request_seeds"]) and set(first_turn[2:]) <= set(
                b["request_seeds"]
            )
    evals0 = [p for p in rank0["plays"] if p["split"] == "test"]
    evals1 = [p for p in rank1["plays"] if p["split"] == "test"]
    assert len(evals0) == len(evals1) > 0
    assert all(not set(a["tasks"]) & set(b["tasks"]) for a, b in zip(evals0, evals1, strict=True))
    seeds = [s for rank in (rank0, rank1) for p in rank["plays"] for s in p["request_seeds"]]
    assert len(seeds) == len(set(seeds)) > 0


# ------------------------------------------------------------------------------------------ lockstep + resume
@pytest.fixture(scope="module")
def lockstep_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """3 steps on 2 processes with an engine each (torchrun, lockstep): a checkpoint after every step, eval at 2."""
    root = tmp_path_factory.mktemp("vllm_lockstep")
    overrides = ("rollout.mode=lockstep", "max_steps=3", "checkpoint.keep_last=0", "eval.every=2")
    rc, output = launch(
        torchrun(2, *record(root / "out", tiny_model_path(), root, *ENGINE, *overrides)), root / "log"
    )
    assert rc == 0, output[-4000:]
    return {"root": root, "run_dir": root / "tiny_test", "ranks": ranks(root / "out", 2)}


@pytest.mark.timeout(900)
def test_two_engines_play_disjoint_episodes_and_sample_the_pushed_weights(
    lockstep_run: dict[str, Any],
) -> None:
    rank0, rank1 = lockstep_run["ranks"]
    check_disjoint_plays(rank0, rank1, steps=3, lockstep=True)
    history = rank0["history"]  # the mean over the ranks (rank 1 logs the same)
    assert [r["step"] for r in history] == [1, 2, 3] and rank1["history"] == history
    assert all(r["rollout/staleness"] == 0 for r in history)
    # after every push both engines sample from the weights being trained ...
    assert all(r["sampler_kl"] < ON_POLICY_KL for r in history), [r["sampler_kl"] for r in history]
    # ... which moved far enough from the start for a stale engine to show
    assert history[-1]["kl"] > 1e-3 and all(r["grad_norm"] > 0 for r in history)


@pytest.mark.timeout(900)
def test_two_engine_run_exports_the_weights_both_ranks_trained(lockstep_run: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    out: Path = lockstep_run["root"] / "out"
    trained0, trained1 = torch.load(out / "params_rank_0.pt"), torch.load(out / "params_rank_1.pt")
    assert max_diff(trained0, trained1) == 0.0
    reloaded = AutoModelForCausalLM.from_pretrained(lockstep_run["run_dir"] / "model", dtype=torch.float32)
    state = {k: v for k, v in reloaded.state_dict().items() if k in trained0}
    assert max_diff(state, {k: trained0[k] for k in state}) == 0.0


@pytest.mark.timeout(900)
def test_two_engine_checkpoint_resumes_exactly(lockstep_run: dict[str, Any], tmp_path: Path) -> None:
    import torch

    step2 = lockstep_run["run_dir"] / "checkpoints" / "step_00000002"
    overrides = ("rollout.mode=lockstep", "max_steps=3", f"checkpoint.resume={step2}")
    rc, output = launch(
        torchrun(2, *record(tmp_path / "out", tiny_model_path(), tmp_path, *ENGINE, *overrides)),
        tmp_path / "log",
    )
    assert rc == 0, output[-4000:]
    for new, old in zip(ranks(tmp_path / "out", 2), lockstep_run["ranks"], strict=True):
        assert train_plays(new) == train_plays(old)[2:]  # the engines restart on the checkpoint's weights
        assert new["history"][-1]["step"] == 3
        same_metrics(new["history"][-1], old["history"][-1])
    diff = max_diff(
        torch.load(tmp_path / "out" / "params_rank_0.pt"),
        torch.load(lockstep_run["root"] / "out" / "params_rank_0.pt"),
    )
    assert diff <= 1e-6


# ------------------------------------------------------------------------------------------ async + overlap
@pytest.mark.timeout(900)
def test_accelerate_launch_async_overlap_on_two_engines(tmp_path: Path) -> None:
    config = REPO / "examples" / "configs" / "accelerate" / "multi_cpu.yaml"
    overrides = (
        "rollout.mode=async",
        "rollout.overlap=true",
        "max_steps=3",
        "eval.every=2",
        "checkpoint.every=0",  # a checkpoint (like an eval) ends the overlap: the next step samples on-policy
        "checkpoint.save_final=false",
        "checkpoint.save_model=false",
    )
    args = accelerate_launch(
        "--config_file",
        str(config),
        *record(tmp_path / "out", tiny_model_path(), tmp_path, *ENGINE, *overrides),
    )
    rc, output = launch(args, tmp_path / "log")
    assert rc == 0, output[-4000:]
    rank0, rank1 = ranks(tmp_path / "out", 2)
    check_disjoint_plays(rank0, rank1, steps=3, lockstep=False)
    history = rank0["history"]
    # step 2 was rolled out while step 1 trained; the eval after step 2 ends the overlap for step 3
    assert [r["rollout/staleness"] for r in history] == [0.0, 1.0, 0.0]
    assert all("tis/weight_mean" in r for r in history)  # the stale samples are corrected (tis_cap 2)
    first, stale, last = (r["sampler_kl"] for r in history)
    assert first < ON_POLICY_KL and last < ON_POLICY_KL, (first, stale, last)
    assert stale > first  # one version behind: the engine had not yet got step 1's update


# ------------------------------------------------------------------------------------------ a killed rank
@pytest.mark.timeout(900)
def test_a_killed_rank_ends_a_two_engine_launch(tmp_path: Path) -> None:
    fault = tmp_path / "fault.txt"
    args = torchrun(
        2, *train_py(tiny_model_path(), tmp_path, *ENGINE, "rollout.mode=lockstep", *faulty("kill", fault))
    )
    # distributed.timeout_s (30) + a margin from the fault to the launcher's exit, or it hung
    rc, output = launch_with_fault(args, tmp_path / "log", fault, after_fault_s=30 + 30)
    assert rc != 0 and fault.exists(), output[-4000:]
    assert "rank 0 stops: rank 1" in output or "Signal 9 (SIGKILL) received by PID" in output
    assert "done:" not in output
