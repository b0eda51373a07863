#!/usr/bin/env bash
# The main job on the embedded default: install into .venv, play scripted agents through
# RLF/DeepSearch-v0 (real search server; transcripts printed), then the env benchmark.
# Usage: bash scripts/main.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q -e .
python -m rlf_envs.demo --episodes 2
rlf-bench env --num-envs 256 --latency-ms 100 --steps 5
