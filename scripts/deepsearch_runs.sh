#!/usr/bin/env bash
# The DeepSearch recipe on a CPU for one seed (docs/learning.md): collect oracle demonstrations from
# the train split -> greedy eval of the base model -> SFT -> GRPO on every hop count -> summary.
# Every stage is resumable: run it again after a stop and it picks up where it was.
#
#   scripts/learning_runs.sh deepsearch SEED [overrides for both trainer stages]
#   OUT=/tmp/ds scripts/learning_runs.sh deepsearch 0
#   GRPO_NAME=grpo_2to3hops GRPO_OVERRIDES='env.kwargs.train_hops=[2,3]' scripts/learning_runs.sh deepsearch 0
#       # a GRPO variant from the same SFT model, in its own run folder (overrides for GRPO only)
#   ONE_HOP=84 TWO_HOP=60 OUT=/tmp/ds_mix scripts/learning_runs.sh deepsearch 0
#       # another mix of oracle demonstrations for the SFT (default 120 + 24); use a new OUT
#   G=algorithm.guidance; GRPO_NAME=grpo_guided \
#   GRPO_OVERRIDES="$G.enabled=true $G.demonstrator=deepsearch-oracle $G.max_hops=2" scripts/learning_runs.sh deepsearch 0
#       # GRPO with guidance: the oracle (at most 2 searches) plays a group's question when all its
#       # samples fail, and its episode joins the group (docs/trainer.md, "Guidance")
#   ORACLE=deepsearch-oracle OUT=runs/deepsearch_plain scripts/learning_runs.sh deepsearch 0 rollout.max_new_tokens=64
#       # the recipe of 2026-12-06's earlier runs: demonstrations that only say what they look up
#       # (the default, deepsearch-oracle-kinds, also says what kind of thing the question asks for
#       # and each search found); use a new OUT
#
# The oracle demonstrations stop at MAX_HOPS searches (default 2: rlf-collect --max-hops): the SFT
# data never shows a third search, so what the model learns about 3-hop questions comes from GRPO.
#
# Writes $OUT/seed$SEED/{sft_data.jsonl, base_eval.json, base_eval.samples.jsonl, sft/, grpo/,
# summary.json} (base_eval.json: rlf-eval's report of the trainer's eval on the base model) and, over
# every seed present, $OUT/deepsearch_summary.json and deepsearch_curves.png (scripts/deepsearch_report.py;
# its --copy-to docs/learning_runs puts them where docs/learning.md cites them). A GRPO variant's
# files carry its name: $GRPO_NAME/, summary_$GRPO_NAME.json, deepsearch_summary_$GRPO_NAME.json...
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:?usage: scripts/learning_runs.sh deepsearch SEED [overrides]}
shift
OUT=${OUT:-runs/deepsearch}
RUN="$OUT/seed$SEED"
SFT_CONFIG=${SFT_CONFIG:-examples/configs/deepsearch_smollm2_sft_cpu.yaml}
GRPO_CONFIG=${GRPO_CONFIG:-examples/configs/deepsearch_smollm2_grpo_cpu.yaml}
GRPO_NAME=${GRPO_NAME:-grpo}
read -r -a GRPO_EXTRA <<< "${GRPO_OVERRIDES:-}"
ONE_HOP=${ONE_HOP:-120}
TWO_HOP=${TWO_HOP:-24}
MAX_HOPS=${MAX_HOPS:-2}
ORACLE=${ORACLE:-deepsearch-oracle-kinds}  # the scripted demonstrator, for the SFT data and for guidance
GRPO_EXTRA=("algorithm.guidance.demonstrator=$ORACLE" "${GRPO_EXTRA[@]}")  # GRPO_OVERRIDES still win
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$RUN"
stamp() { echo "== $(date -u +%H:%M:%S) seed $SEED: $*"; }

stamp "collect $ONE_HOP one-hop + $TWO_HOP two-hop $ORACLE demonstrations (train split, at most $MAX_HOPS searches)"
for spec in "1:$ONE_HOP" "2:$TWO_HOP"; do
  hops=${spec%%:*}
  count=${spec##*:}
  if [[ "$count" -gt 0 ]]; then
    python -m rlf_trainer.data.demonstrations_cli RLF/DeepSearch-v0 --agent "$ORACLE" --max-hops "$MAX_HOPS" \
      --where "hops=$hops" \
      --sample "$count" --seed "$SEED" --env-kwargs '{"world_seed": 0, "max_turns": 4, "top_k": 2}' \
      --out "$RUN/sft_data.jsonl" --resume
  fi
done

if [[ ! -s "$RUN/base_eval.json" ]]; then
  stamp "base model, greedy, test sample"
  python -m rlf_trainer.eval_cli --config "$SFT_CONFIG" --out "$RUN/base_eval.json" seed="$SEED" "$@"  # rlf-eval
fi

if [[ ! -f "$RUN/sft/model/config.json" ]]; then
  stamp "SFT"
  python -m rlf_trainer.cli --config "$SFT_CONFIG" seed="$SEED" sft.data="$RUN/sft_data.jsonl" \
    logging.dir="$RUN" logging.run_name=sft "$@" 2>&1 | tee -a "$RUN/sft.log"
fi

if [[ ! -f "$RUN/$GRPO_NAME/model/config.json" ]]; then
  stamp "GRPO ($GRPO_NAME${GRPO_OVERRIDES:+: $GRPO_OVERRIDES})"
  python -m rlf_trainer.cli --config "$GRPO_CONFIG" seed="$SEED" model.path="$RUN/sft/model" \
    logging.dir="$RUN" logging.run_name="$GRPO_NAME" "${GRPO_EXTRA[@]}" "$@" 2>&1 | tee -a "$RUN/$GRPO_NAME.log"
fi

# The fair baseline: the SFT model trained on the same demonstrations for as many more steps as GRPO
# ran (does RL add what more imitation does not?). BASELINE=0 skips it.
GRPO_STEPS=${GRPO_STEPS:-$(sed -n 's/^max_steps: *\([0-9]*\).*/\1/p' "$GRPO_CONFIG")}
if [[ "${BASELINE:-1}" != 0 && ! -f "$RUN/sft_more/model/config.json" ]]; then
  stamp "baseline: SFT for $GRPO_STEPS more steps from the SFT model"
  python -m rlf_trainer.cli --config "$SFT_CONFIG" seed="$SEED" sft.data="$RUN/sft_data.jsonl" \
    model.path="$RUN/sft/model" model.prepare=null max_steps="$GRPO_STEPS" eval.every="$GRPO_STEPS" \
    checkpoint.every=4 logging.dir="$RUN" logging.run_name=sft_more "$@" 2>&1 | tee -a "$RUN/sft_more.log"
fi

stamp "summary of $GRPO_NAME -> $OUT/deepsearch_summary*.json, $OUT/deepsearch_curves*.png"
python scripts/deepsearch_report.py "$OUT" --grpo-run "$GRPO_NAME"
