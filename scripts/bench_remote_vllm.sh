#!/usr/bin/env bash
# A GRPO config's step with its rollouts on a `vllm serve` process (vLLM's CPU build, bf16) next to a
# bf16 trainer (policy.backend=remote), against the HF policy in fp32 (mixed_precision=no) and bf16,
# one after the other on this machine (docs/benchmarks.md). In its own process vLLM's CPU worker
# cannot bind the trainer's threads, as it does when the engine runs inside the trainer.
#
#   scripts/bench_remote_vllm.sh CONFIG MODEL [STEPS] [overrides for every run]
#   scripts/bench_remote_vllm.sh examples/configs/deepsearch_smollm2_grpo_cpu.yaml runs/deepsearch_kinds/seed0/sft/model
#
# Needs .venv (the trainer) and .venv-vllm (scripts/install_vllm_cpu.sh). Prints rlf-bench train's
# tables: the HF runs first, then the remote one.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: scripts/bench_remote_vllm.sh CONFIG MODEL [STEPS] [overrides]}
MODEL=${2:?usage: scripts/bench_remote_vllm.sh CONFIG MODEL [STEPS] [overrides]}
STEPS=${3:-3}
shift $(( $# < 3 ? $# : 3 ))
PORT=${PORT:-8031}
[[ -x .venv-vllm/bin/python ]] || { echo "no .venv-vllm: run scripts/install_vllm_cpu.sh first" >&2; exit 2; }
# shellcheck disable=SC1091
. .venv/bin/activate
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
work=$(mktemp -d)

echo "== $(date -u +%H:%M:%S) HF policy, fp32 then bf16"
rlf-bench train --config "$CONFIG" --steps "$STEPS" --precisions no bf16 --workdir "$work/hf" \
  model.path="$MODEL" "$@"

echo "== $(date -u +%H:%M:%S) vllm serve (bf16) on 127.0.0.1:$PORT, log $work/vllm.log"
# whole prefills and 32-token blocks, as VLLMPolicy sets them on a CPU (tests/test_trainer_vllm_serve.py)
VLLM_SERVER_DEV_MODE=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2} \
  .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 \
  --port "$PORT" --dtype bfloat16 --max-model-len 2048 --no-enable-chunked-prefill --block-size 32 \
  > "$work/vllm.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  kill -0 $server 2>/dev/null || { tail -n 40 "$work/vllm.log"; echo "vllm serve exited" >&2; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$PORT/health" > /dev/null || { echo "vllm serve never became healthy" >&2; exit 1; }

echo "== $(date -u +%H:%M:%S) trainer bf16, rollouts on vllm serve"
rlf-bench train --config "$CONFIG" --steps "$STEPS" --precisions bf16 --workdir "$work/remote" \
  model.path="$MODEL" policy.backend=remote "policy.remote.urls=[\"http://127.0.0.1:$PORT\"]" \
  policy.remote.request_timeout_s=600 policy.remote.push_dtype=bfloat16 "$@"
echo "== $(date -u +%H:%M:%S) done"
