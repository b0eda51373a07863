#!/usr/bin/env bash
# Reproduce docs/learning.md: GRPO on the codebook tool task with SmolLM2-135M-Instruct on a CPU,
# one run per seed (sequential: they share the cores), a greedy base-model evaluation on the test
# split, then a summary (summary.md / summary.json) and the learning-curve PNG.
#
#   scripts/learning_runs.sh                    # seeds 0 1 2 into runs/learning/
#   SEEDS="3" OUT=/tmp/runs scripts/learning_runs.sh max_steps=5   # extra args: config overrides
#   SUMMARY_ONLY=1 scripts/learning_runs.sh     # recompute the summary from existing runs
#   scripts/learning_runs.sh deepsearch SEED    # the DeepSearch recipe (collect -> SFT -> GRPO), one seed
#
# Needs the prepared model (python -m rlf_trainer.data.models prepare smollm2-135m; the config also
# prepares it on first use). Each run takes ~20 minutes on 2 quiet cores.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "deepsearch" ]]; then  # the DeepSearch recipe, one seed: scripts/deepsearch_runs.sh
  shift
  exec bash scripts/deepsearch_runs.sh "$@"
fi

OUT=${OUT:-runs/learning}
SEEDS=${SEEDS:-"0 1 2"}
CONFIG=${CONFIG:-examples/configs/smollm2_learn_cpu.yaml}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}  # more threads than cores crawls under load
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$OUT"

if [[ -z "${SUMMARY_ONLY:-}" ]]; then
  echo "== base model, greedy, test split -> $OUT/base_eval.json"
  python - "$CONFIG" "$OUT/base_eval.json" "$@" <<'PY'
"""The untrained model on the test split, exactly as the trainer's evaluate() runs it (greedy, 1 sample)."""
import json
import sys

import gymnasium as gym
import torch

import rlf_envs  # noqa: F401
from rlf_trainer.config import load_config
from rlf_trainer.observe.metrics import rollout_metrics
from rlf_trainer.policy.base import SamplingParams
from rlf_trainer.policy.hf import HFPolicy
from rlf_trainer.rollout.lockstep import run_rollout
from rlf_trainer.build import env_kwargs, resolve_model_path
from transformers import AutoModelForCausalLM, AutoTokenizer

config_path, out_path, *overrides = sys.argv[1:]
cfg = load_config(config_path, overrides)
torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "2")))
path = resolve_model_path(cfg)
policy = HFPolicy(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path))
num_envs = cfg.rollout.prompts_per_step * cfg.algorithm.group_size
envs = gym.make_vec(cfg.env.id, num_envs=num_envs, **env_kwargs(cfg))
stats = []
try:
    prompts = list(range(cfg.eval.num_prompts))
    for start in range(0, len(prompts), num_envs):
        chunk = prompts[start : start + num_envs]
        padded = chunk + [chunk[-1]] * (num_envs - len(chunk))
        batch = run_rollout(
            envs, policy, padded, group_size=1,
            sampling=SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens, temperature=cfg.eval.temperature, seed=0),
            max_total_tokens=cfg.rollout.max_total_tokens, split=cfg.env.test_split,
        )
        stats.extend(batch.stats[: len(chunk)])
finally:
    envs.close()
metrics = rollout_metrics(stats, prefix="eval/")
metrics["eval/tool_ok_rate"] = sum(s.reward_info.get("tool_ok", 0.0) for s in stats) / len(stats)
metrics["eval/num_prompts"] = len(stats)
json.dump(metrics, open(out_path, "w"), indent=1)
print(json.dumps({k: round(v, 4) for k, v in metrics.items()}))
PY

  for seed in $SEEDS; do
    run="seed$seed"
    rm -rf "${OUT:?}/$run"  # train_samples.jsonl is appended to: never mix two runs
    (while true; do echo "$(date +%s) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 30; done) > "$OUT/$run.loadavg" &
    sampler=$!
    started=$(date +%s)
    echo "== seed $seed -> $OUT/$run ($(date))"
    python examples/train.py --config "$CONFIG" seed="$seed" logging.dir="$OUT" logging.run_name="$run" "$@" \
      2>&1 | tee "$OUT/$run.log"
    echo $(( $(date +%s) - started )) > "$OUT/$run.wall_s"
    kill "$sampler"
  done
fi

echo "== summary -> $OUT/summary.md, $OUT/summary.json, $OUT/learning_curve.png"
python - "$OUT" $SEEDS <<'PY'
"""Per-seed and overall numbers from each run's metrics.jsonl and train_samples.jsonl.

Definitions (fixed before the runs): per step, over all its episodes (samples_per_step = every
episode): reward mean; tool-call rate = share of episodes with at least one tool call (well-formed
or not); lookup rate = share with a successful lookup of the asked word; accuracy = share whose
final reply states the right code (reward_info "acc"); answer-tag rate = share that used
<answer> tags. "first 10" = steps 1-10, "last 10" = the last 10 steps. Spread over seeds: sample
standard deviation (ddof 1).
"""
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

out = Path(sys.argv[1])
seeds = sys.argv[2:]
PARTS = {"reward": None, "tool_call_rate": "tool_called", "lookup_rate": "tool_ok", "accuracy": "acc", "answer_tag_rate": "answer_tag"}


def per_step(run: Path) -> dict[int, dict[str, float]]:
    episodes = defaultdict(list)
    for line in (run / "train_samples.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            episodes[record["step"]].append(record)
    steps = {}
    for step, records in sorted(episodes.items()):
        row = {"episodes": len(records)}
        for name, key in PARTS.items():
            values = [r["reward"] if key is None else float(r["reward_info"].get(key, 0.0)) for r in records]
            row[name] = sum(values) / len(values)
        steps[step] = row
    return steps


def mean(values):
    return sum(values) / len(values)


def spread(values):
    return statistics.stdev(values) if len(values) > 1 else 0.0


summary = {"seeds": {}, "definitions": __doc__}
curves = {}
for seed in seeds:
    run = out / f"seed{seed}"
    steps = per_step(run)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ordered = sorted(steps)
    first, last = ordered[:10], ordered[-10:]
    entry = {"steps": len(ordered), "episodes_per_step": sorted({steps[s]["episodes"] for s in ordered})}
    for name in PARTS:
        a, b = mean([steps[s][name] for s in first]), mean([steps[s][name] for s in last])
        entry[name] = {"first10": a, "last10": b, "diff": b - a}
    # cross-check against the trainer's own per-step reward mean
    logged = {int(m["step"]): m["reward/mean"] for m in metrics if "reward/mean" in m}
    entry["max_reward_mismatch_vs_metrics"] = max(abs(logged[s] - steps[s]["reward"]) for s in ordered)
    entry["step_time_s_mean"] = mean([m["time/step"] for m in metrics if "time/step" in m])
    final_eval = [m for m in metrics if "eval/reward" in m]
    if final_eval:
        entry["final_eval"] = {k: v for k, v in final_eval[-1].items() if k.startswith("eval/")}
    wall = run.parent / f"seed{seed}.wall_s"
    if wall.exists():
        entry["wall_s"] = int(wall.read_text())
    loads = run.parent / f"seed{seed}.loadavg"
    if loads.exists() and loads.read_text().strip():
        one_min = [float(line.split()[1]) for line in loads.read_text().splitlines() if len(line.split()) >= 2]
        entry["loadavg_1min"] = {"mean": mean(one_min), "max": max(one_min), "samples": len(one_min)}
    summary["seeds"][seed] = entry
    curves[seed] = steps

overall = {}
for name in PARTS:
    diffs = [summary["seeds"][s][name]["diff"] for s in seeds]
    overall[name] = {
        "first10_mean": mean([summary["seeds"][s][name]["first10"] for s in seeds]),
        "last10_mean": mean([summary["seeds"][s][name]["last10"] for s in seeds]),
        "diff_mean": mean(diffs),
        "diff_std": spread(diffs),
        "diff_per_seed": dict(zip(seeds, diffs)),
    }
summary["overall"] = overall
base = out / "base_eval.json"
if base.exists():
    summary["base_eval"] = json.loads(base.read_text())
(out / "summary.json").write_text(json.dumps(summary, indent=1))

lines = ["| seed | metric | first 10 steps | last 10 steps | last - first |", "|---|---|---|---|---|"]
for seed in seeds:
    for name in PARTS:
        v = summary["seeds"][seed][name]
        lines.append(f"| {seed} | {name} | {v['first10']:.3f} | {v['last10']:.3f} | {v['diff']:+.3f} |")
lines += ["", "| metric | first 10 (mean of seeds) | last 10 (mean of seeds) | difference, mean +- std over seeds | per seed |", "|---|---|---|---|---|"]
for name, v in overall.items():
    per_seed = ", ".join(f"{s}: {d:+.3f}" for s, d in v["diff_per_seed"].items())
    lines.append(f"| {name} | {v['first10_mean']:.3f} | {v['last10_mean']:.3f} | {v['diff_mean']:+.3f} +- {v['diff_std']:.3f} | {per_seed} |")
lines += ["", "| seed | wall s | mean s/step | load avg (1 min) mean / max | final greedy eval on test: reward, accuracy |", "|---|---|---|---|---|"]
for seed in seeds:
    e = summary["seeds"][seed]
    load = e.get("loadavg_1min", {})
    ev = e.get("final_eval", {})
    lines.append(
        f"| {seed} | {e.get('wall_s', '?')} | {e['step_time_s_mean']:.1f} | {load.get('mean', float('nan')):.2f} / {load.get('max', float('nan')):.2f} "
        f"| {ev.get('eval/reward', float('nan')):.3f}, {ev.get('eval/accuracy', float('nan')):.3f} |"
    )
if "base_eval" in summary:
    b = summary["base_eval"]
    lines.append(f"\nBase model, greedy, test split ({int(b['eval/num_prompts'])} prompts): reward {b['eval/reward/mean']:.3f}, accuracy {b.get('eval/accuracy', 0.0):.3f}, lookup rate {b['eval/tool_ok_rate']:.3f}")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))

fig, axes = plt.subplots(3, 1, figsize=(7, 8.5), dpi=110, sharex=True)
panels = [("reward", "reward (mean per step)"), ("tool_call_rate", "tool-call rate"), ("accuracy", "answer accuracy")]
colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
for ax, (name, label) in zip(axes, panels):
    for i, seed in enumerate(seeds):
        steps = sorted(curves[seed])
        ax.plot(steps, [curves[seed][s][name] for s in steps], marker="o", markersize=3, color=colors[i % len(colors)], alpha=0.8, label=f"seed {seed}")
    common = sorted(set.intersection(*(set(curves[s]) for s in seeds)))
    ax.plot(common, [mean([curves[s][t][name] for s in seeds]) for t in common], color="black", linewidth=2, label="mean of seeds")
    if name == "tool_call_rate":
        for i, seed in enumerate(seeds):
            steps = sorted(curves[seed])
            ax.plot(steps, [curves[seed][s]["lookup_rate"] for s in steps], linestyle="--", color=colors[i % len(colors)], alpha=0.5)
        ax.plot([], [], linestyle="--", color="gray", label="successful lookup rate")
    ax.set_ylabel(label)
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8, loc="lower right")
axes[1].legend(fontsize=8, loc="lower right", handles=axes[1].get_lines()[-1:])
axes[-1].set_xlabel("GRPO step (8 episodes each)")
fig.suptitle("SmolLM2-135M-Instruct, GRPO on the codebook tool task (CPU)")
fig.tight_layout()
fig.savefig(out / "learning_curve.png")
PY
