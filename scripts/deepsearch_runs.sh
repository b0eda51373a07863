#!/usr/bin/env bash
# The DeepSearch recipe on a CPU for one seed (docs/learning.md): collect oracle demonstrations from
# the train split -> greedy eval of the base model -> SFT -> GRPO on 2-3 hop questions -> summary.
# Every stage is resumable: run it again after a stop and it picks up where it was.
#
#   scripts/learning_runs.sh deepsearch SEED [overrides for both trainer stages]
#   OUT=/tmp/ds scripts/learning_runs.sh deepsearch 0
#
# Writes $OUT/seed$SEED/{sft_data.jsonl, base_eval.json, sft/, grpo/, summary.json} and, over every
# seed present, $OUT/deepsearch_summary.json (the file docs/learning_runs/ keeps).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${1:?usage: scripts/learning_runs.sh deepsearch SEED [overrides]}
shift
OUT=${OUT:-runs/deepsearch}
RUN="$OUT/seed$SEED"
SFT_CONFIG=${SFT_CONFIG:-examples/configs/deepsearch_smollm2_sft_cpu.yaml}
GRPO_CONFIG=${GRPO_CONFIG:-examples/configs/deepsearch_smollm2_grpo_cpu.yaml}
ONE_HOP=${ONE_HOP:-120}
TWO_HOP=${TWO_HOP:-24}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$RUN"
stamp() { echo "== $(date -u +%H:%M:%S) seed $SEED: $*"; }

stamp "collect $ONE_HOP one-hop + $TWO_HOP two-hop oracle demonstrations (train split)"
for spec in "1:$ONE_HOP" "2:$TWO_HOP"; do
  hops=${spec%%:*}
  count=${spec##*:}
  if [[ "$count" -gt 0 ]]; then
    python -m rlf_trainer.demonstrations_cli RLF/DeepSearch-v0 --agent deepsearch-oracle --where "hops=$hops" \
      --sample "$count" --seed "$SEED" --env-kwargs '{"world_seed": 0, "max_turns": 4, "top_k": 2}' \
      --out "$RUN/sft_data.jsonl" --resume
  fi
done

if [[ ! -s "$RUN/base_eval.json" ]]; then
  stamp "base model, greedy, test sample"
  python -m rlf_trainer.evaluate_cli --config "$SFT_CONFIG" --out "$RUN/base_eval.json" \
    seed="$SEED" logging.dir="$RUN" logging.run_name=base_eval "$@"
fi

if [[ ! -f "$RUN/sft/model/config.json" ]]; then
  stamp "SFT"
  python -m rlf_trainer.cli --config "$SFT_CONFIG" seed="$SEED" sft.data="$RUN/sft_data.jsonl" \
    logging.dir="$RUN" logging.run_name=sft "$@" 2>&1 | tee -a "$RUN/sft.log"
fi

if [[ ! -f "$RUN/grpo/model/config.json" ]]; then
  stamp "GRPO on 2-3 hop train questions"
  python -m rlf_trainer.cli --config "$GRPO_CONFIG" seed="$SEED" model.path="$RUN/sft/model" \
    logging.dir="$RUN" logging.run_name=grpo "$@" 2>&1 | tee -a "$RUN/grpo.log"
fi

stamp "summary -> $OUT/deepsearch_summary.json"
python - "$OUT" <<'PY'
"""Per seed: EM (all sampled test questions), EM on the 2-3 hop ones, per hop, searches per episode,
for the base model, after SFT and after GRPO (each stage's last eval in its metrics.jsonl)."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])


def last_eval(path: Path) -> dict:
    if path.suffix == ".json":
        return json.loads(path.read_text()) if path.exists() else {}
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    evals = [r for r in rows if "eval/accuracy" in r]
    return evals[-1] if evals else {}


def figures(m: dict) -> dict:
    if not m:
        return {}
    hops = {h: (m.get(f"eval/hops={h}/accuracy"), m.get(f"eval/hops={h}/episodes", 0.0)) for h in (1, 2, 3)}
    multi = [(a, n) for h, (a, n) in hops.items() if h > 1 and a is not None]
    return {"em": m.get("eval/accuracy"),
            "em_multihop": sum(a * n for a, n in multi) / sum(n for _, n in multi) if multi else None,
            **{f"em_hops{h}": a for h, (a, _) in hops.items()},
            **{f"episodes_hops{h}": n for h, (_, n) in hops.items()},
            "searches_per_episode": m.get("eval/tool_calls_per_episode"),
            "tool_error_rate": m.get("eval/tool_error_rate")}  # fmt: skip


summary = {"base": {}, "sft": {}, "grpo": {}, "seeds": []}
for run in sorted(out.glob("seed*")):
    stages = {"base": last_eval(run / "base_eval.json"), "sft": last_eval(run / "sft" / "metrics.jsonl"),
              "grpo": last_eval(run / "grpo" / "metrics.jsonl")}  # fmt: skip
    per = {k: figures(v) for k, v in stages.items()}
    (run / "summary.json").write_text(json.dumps(per, indent=1))
    summary["seeds"].append(run.name.removeprefix("seed"))
    for stage, values in per.items():
        for key, value in values.items():
            summary[stage].setdefault(key, []).append(value)
(out / "deepsearch_summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
PY
