#!/usr/bin/env bash
# avg@4 and pass@4 at T=1 of one DeepSearch seed's models (docs/learning.md): rlf-eval on the same
# seeded sample of 170 test questions as the greedy evals, 4 samples each, per hop count.
#
#   scripts/deepsearch_sample_evals.sh SEED [STAGE ...]     # stages: run folders with a model/ (default: sft grpo)
#   OUT=/tmp/ds scripts/deepsearch_sample_evals.sh 0 sft grpo sft_more
#   NUM_PROMPTS=85 scripts/deepsearch_sample_evals.sh 0       # a smaller seeded sample of test questions
#   EVAL_OVERRIDES="rollout.max_new_tokens=96" OUT=runs/deepsearch_kinds scripts/deepsearch_sample_evals.sh 0
#       # config overrides for the evals (the runs' own, e.g. longer turns)
#   BACKEND=vllm PATH=.venv-vllm/bin:$PATH scripts/deepsearch_sample_evals.sh 0   # sample with vLLM's CPU engine (bf16; run from .venv-vllm)
#       # vLLM on a CPU reserves policy.vllm.gpu_memory_utilization of the RAM for its KV cache and
#       # touches it all (0.75, its default, took a process to 18.6 GB here); these evals use
#       # VLLM_MEMORY=0.2 (~4.7 GB on 24 GB), plenty for 4 x 85 episodes of <= 1,536 tokens
#
# Writes $OUT/seed$SEED/STAGE_t1_eval.json (+ .samples.jsonl); scripts/deepsearch_report.py reads them.
# A stage whose report exists is skipped, so a stopped run picks up where it was.
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:?usage: scripts/deepsearch_sample_evals.sh SEED [STAGE ...]}
shift
STAGES=("$@")
[[ ${#STAGES[@]} -gt 0 ]] || STAGES=(sft grpo)
OUT=${OUT:-runs/deepsearch}
CONFIG=${GRPO_CONFIG:-examples/configs/deepsearch_smollm2_grpo_cpu.yaml}
BACKEND=${BACKEND:-hf}
EXTRA=()
[[ "$BACKEND" == vllm ]] && EXTRA=("policy.vllm.gpu_memory_utilization=${VLLM_MEMORY:-0.2}")
read -r -a OVERRIDES <<< "${EVAL_OVERRIDES:-}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for stage in "${STAGES[@]}"; do
  report="$OUT/seed$SEED/${stage}_t1_eval.json"
  if [[ ! -s "$report" ]]; then
    echo "== $(date -u +%H:%M:%S) seed $SEED: $stage, ${NUM_PROMPTS:-170} questions x 4 samples at T=1 ($BACKEND)"
    python -m rlf_trainer.eval_cli --config "$CONFIG" --model-path "$OUT/seed$SEED/$stage/model" --backend "$BACKEND" \
      ${NUM_PROMPTS:+--num-prompts "$NUM_PROMPTS"} --samples 4 --temperature 1.0 --pass-k 1 4 \
      --out "$report" --no-progress seed="$SEED" "${EXTRA[@]}" "${OVERRIDES[@]}"
  fi
done
