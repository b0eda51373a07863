#!/usr/bin/env bash
# The GPU check (rlf_bench/gpu_check.py): one script, <= 8 minutes on one H200, a JSON report and a
# log in the folder given as its argument.
#
#   bash scripts/gpu_check.sh --fetch-wheels      # HERE (with PyPI): the wheels the GPU image lacks -> .whl/
#   bash scripts/gpu_check.sh OUT                 # THERE: install .whl/ if present, run, write OUT/gpu_check.json
#   bash scripts/gpu_check.sh --dry-run OUT       # any machine: tiny shapes, the same code path (the tests run it)
#
# The lent GPU machine has its own python3 with torch, transformers, accelerate, peft, aiohttp and
# numpy, reaches no registry, and takes at most 64 MiB of carried files: the env half's small
# dependencies travel as wheels (.whl/, ignored by git); vLLM (hundreds of MB) cannot, so where it
# is missing the report says so and the GRPO and rollout parts run on the HF backend instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# the versions of the main venv (pip freeze), for the GPU image's Python 3.12
WHEELS=(gymnasium==1.4.0 farama-notifications==0.0.6 cloudpickle==3.1.3 mcp==2.3.0 mcp-types==2.3.0
        httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 opentelemetry-api==1.45.2 pydantic==2.14.4
        pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
        anyio==4.16.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
        rpds-py==2026.9.1 starlette==1.10.0 uvicorn==0.55.0 sse-starlette==3.7.1 python-multipart==0.0.34
        pyjwt==2.15.1 bm25s==0.3.16 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12)  # mcp 2.3 needs cryptography

if [[ "${1:-}" == "--fetch-wheels" ]]; then
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d .whl "${WHEELS[@]}"
    du -sh .whl
    exit 0
fi

DRY=()
if [[ "${1:-}" == "--dry-run" ]]; then DRY=(--dry-run); shift; fi
OUT=${1:?usage: scripts/gpu_check.sh [--dry-run] OUT   (or --fetch-wheels)}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
# only where the env half's dependencies are missing (the GPU image), never over a working venv
if ! "$PY" -c "import gymnasium, mcp, bm25s" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/rlf-site .whl/*.whl
    export PYTHONPATH="/tmp/rlf-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
"$PY" -m rlf_bench.gpu_check "${DRY[@]}" --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
