"""The DeepSearch recipe's figures over every seed run so far (docs/learning.md, issue 22).

Reads ``OUT/seed*/`` as ``scripts/learning_runs.sh deepsearch SEED`` leaves it (``base_eval.json``,
``sft/metrics.jsonl``, ``grpo/metrics.jsonl``; ``--grpo-run NAME`` reads a GRPO variant's folder
``NAME/`` instead, as ``GRPO_NAME=NAME`` writes it) and writes:

- ``OUT/seed*/summary.json`` and ``OUT/deepsearch_summary.json``: per stage (base, sft, grpo, and
  sft_more: the SFT model trained on for as many steps as GRPO ran, the fair baseline) one list per
  figure with a value per seed (``em`` over every sampled test question, ``em_multihop`` over the
  2- and 3-hop ones, per-hop EM, searches per episode, tool error rate), plus their mean and sample
  std (ddof 1) and issue 33's per-seed targets checked;
- with ``OUT/seed*/STAGE_t1_eval.json`` (scripts/deepsearch_sample_evals.sh: rlf-eval, 4 samples
  at T=1), each stage's ``avg4``/``pass4`` overall and per hop count (``avg4_hops1``...);
- ``train`` in the summary (``--world-seed``, the world the runs trained on): per seed, per hop
  count and per half of the GRPO run (steps 1-8, 9-16), from ``train_samples.jsonl``: groups,
  the policy's own mean reward, EM and searches per episode, and the share of groups guided;
- ``OUT/deepsearch_curves.png``: per seed, GRPO train reward, searches per episode and answered
  share per step, and per-hop EM of the greedy evals (base, after SFT, after GRPO);
- the markdown table of docs/learning.md on stdout.

A stage whose eval has not run yet is left out (``null`` in the lists). With ``--grpo-run NAME``
other than ``grpo`` every file written carries ``_NAME`` (``deepsearch_summary_NAME.json``...), so
the recipe's figures and a variant's sit side by side.

    python scripts/deepsearch_report.py runs/deepsearch [--grpo-run grpo] [--copy-to docs/learning_runs]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

STAGES = ("base", "sft", "grpo")
BASELINE = "sft_more"  # optional: scripts/deepsearch_runs.sh writes it after GRPO (BASELINE=0 skips it)
HOPS = (1, 2, 3)


def suffix(grpo_run: str) -> str:
    """The tag of the files written for a GRPO variant (none for the recipe's own ``grpo`` folder)."""
    return "" if grpo_run == "grpo" else f"_{grpo_run}"


def report_files(grpo_run: str) -> tuple[str, str]:
    """The names of the summary JSON and the curves PNG written in OUT (and copied to the docs)."""
    tag = suffix(grpo_run)
    return f"deepsearch_summary{tag}.json", f"deepsearch_curves{tag}.png"


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def last_eval(run: Path, folder: str) -> dict[str, float]:
    """The last eval of the stage run in ``run/folder`` (``base``: ``run/base_eval.json``, an
    ``rlf-eval`` report whose ``metrics`` are the trainer's ``eval/*``; older files hold them alone)."""
    if folder == "base":
        path = run / "base_eval.json"
        report = json.loads(path.read_text()) if path.exists() else {}
        return report.get("metrics", report)
    evals = [r for r in read_jsonl(run / folder / "metrics.jsonl") if "eval/accuracy" in r]
    return evals[-1] if evals else {}


def sampled_figures(run: Path, folder: str) -> dict[str, float]:
    """avg@4 and pass@4 at T=1, overall and per hop, from ``run/folder_t1_eval.json`` (none if absent)."""
    path = run / f"{folder}_t1_eval.json"
    if not path.exists():
        return {}
    m = json.loads(path.read_text())["metrics"]
    figures = {"avg4": m.get("eval/avg@4"), "pass4": m.get("eval/pass@4")}
    for h in HOPS:
        figures |= {
            f"avg4_hops{h}": m.get(f"eval/hops={h}/avg@4"),
            f"pass4_hops{h}": m.get(f"eval/hops={h}/pass@4"),
        }
    return figures


def train_by_hops(
    samples: list[dict[str, Any]],
    hops_of: dict[str, int],
    steps: int,
    false_claims: Callable[[dict[str, Any]], int] | None = None,
) -> dict[str, Any]:
    """Per hop count and per half of the run: groups, the policy's own reward / EM / searches, and
    the share of groups a demonstration joined (``demonstration`` rows are not the policy's);
    with ``false_claims`` (a row -> its count of false kind statements), their mean per episode.

    Example:
        >>> rows = [{"step": 1, "task_id": "a", "group": 0, "reward": 1.0, "reward_info": {"em": 1.0},
        ...          "tool_calls": 1, "demonstration": False},
        ...         {"step": 1, "task_id": "a", "group": 0, "reward": 1.0, "reward_info": {"em": 1.0},
        ...          "tool_calls": 1, "demonstration": True},
        ...         {"step": 2, "task_id": "a", "group": 0, "reward": 0.2, "reward_info": {"em": 0.0},
        ...          "tool_calls": 2, "demonstration": False}]
        >>> train_by_hops(rows, {"a": 1}, steps=2)["hops1"]
        {'steps 1-1': {'groups': 1, 'reward': 1.0, 'em': 1.0, 'searches': 1.0, 'guided': 1.0}, 'steps 2-2': {'groups': 1, 'reward': 0.2, 'em': 0.0, 'searches': 2.0, 'guided': 0.0}}
    """
    half = (steps + 1) // 2
    out: dict[str, Any] = {}
    for h in sorted({hops_of[r["task_id"]] for r in samples}):
        out[f"hops{h}"] = {}
        for first, last in ((1, half), (half + 1, steps)):
            rows = [r for r in samples if hops_of[r["task_id"]] == h and first <= r["step"] <= last]
            own = [r for r in rows if not r.get("demonstration")]
            groups = {(r["step"], r["group"]) for r in rows}
            guided = {(r["step"], r["group"]) for r in rows if r.get("demonstration")}
            if not own:
                continue
            figures = out[f"hops{h}"][f"steps {first}-{last}"] = {
                "groups": len(groups),
                "reward": round(statistics.fmean(r["reward"] for r in own), 3),
                "em": round(statistics.fmean(r["reward_info"].get("em", 0.0) for r in own), 3),
                "searches": round(statistics.fmean(r["tool_calls"] for r in own), 3),
                "guided": round(len(guided) / len(groups), 3),
            }
            redundant = [
                r["reward_info"]["redundant_searches"]
                for r in own
                if "redundant_searches" in r["reward_info"]
            ]
            if redundant:  # searches after every supporting document was shown (newer runs report them)
                figures["redundant"] = round(statistics.fmean(redundant), 3)
            if false_claims is not None:
                figures["false_claims"] = round(statistics.fmean(false_claims(r) for r in own), 3)
    return out


def train_table(train: dict[str, Any]) -> str:
    """GRPO's train episodes per seed, hop count and half of the run, as a markdown table."""
    lines = ["| seed | hops | steps | groups | own reward | own EM | searches / episode | redundant searches | "
             "false kind statements / episode | guided groups |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for seed, by_hops in train.items():
        for hops, halves in by_hops.items():
            for steps, f in halves.items():
                redundant = f"{f['redundant']:.2f}" if "redundant" in f else "-"
                claims = f"{f['false_claims']:.2f}" if "false_claims" in f else "-"
                lines.append(f"| {seed} | {hops.removeprefix('hops')} | {steps.removeprefix('steps ')} | "
                             f"{f['groups']} | {f['reward']:.3f} | {f['em']:.3f} | {f['searches']:.2f} | "
                             f"{redundant} | {claims} | {f['guided']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def stage_figures(m: dict[str, float]) -> dict[str, float | None]:
    """EM overall, on 2-3 hops (episode-weighted) and per hop; searches per episode; tool errors per call."""
    if not m:
        return {}
    hops = {h: (m.get(f"eval/hops={h}/accuracy"), m.get(f"eval/hops={h}/episodes", 0.0)) for h in HOPS}
    multi = [(a, n) for h, (a, n) in hops.items() if h > 1 and a is not None]
    return {
        "em": m.get("eval/accuracy"),
        "em_multihop": sum(a * n for a, n in multi) / sum(n for _, n in multi) if multi else None,
        **{f"em_hops{h}": a for h, (a, _) in hops.items()},
        **{f"episodes_hops{h}": n for h, (_, n) in hops.items()},
        "searches_per_episode": m.get("eval/tool_calls_per_episode"),
        "tool_error_rate": m.get("eval/tool_error_rate"),
    }


def mean_std(values: list[float | None]) -> dict[str, float | int] | None:
    present = [v for v in values if v is not None]
    if not present:
        return None
    std = statistics.stdev(present) if len(present) > 1 else 0.0
    return {"mean": statistics.fmean(present), "std": std, "seeds": len(present)}


def targets(summary: dict[str, Any]) -> dict[str, Any]:
    """Issue 33's targets, per seed with all three stages: GRPO's overall EM at least 0.10 above its
    own SFT start on every seed; no hop count more than 0.05 below the SFT start on any seed; 3-hop
    EM at least 0.20 on 2 seeds of 3. A target over seeds is met only once 3 seeds are complete."""
    complete = [
        i for i, _ in enumerate(summary["seeds"]) if all(summary[s]["em"][i] is not None for s in STAGES)
    ]
    grpo, sft = summary["grpo"], summary["sft"]
    gain = [grpo["em"][i] - sft["em"][i] for i in complete]
    worst_hop = [min(grpo[f"em_hops{h}"][i] - sft[f"em_hops{h}"][i] for h in HOPS) for i in complete]
    three_hop = [grpo["em_hops3"][i] for i in complete]
    baseline = summary.get(BASELINE, {}).get("em", [])
    over_baseline = [
        grpo["em"][i] - baseline[i] if i < len(baseline) and baseline[i] is not None else None
        for i in complete
    ]
    enough = len(complete) >= 3
    return {
        "seeds": [summary["seeds"][i] for i in complete],
        "sft_em_minus_base": [sft["em"][i] - summary["base"]["em"][i] for i in complete],
        "grpo_em_minus_sft": gain,
        "grpo_em_minus_sft_met": enough and all(g >= 0.10 for g in gain),
        "grpo_worst_hop_minus_sft": worst_hop,
        "grpo_worst_hop_minus_sft_met": enough and all(w >= -0.05 for w in worst_hop),
        "grpo_em_hops3": three_hop,
        "grpo_em_hops3_met": enough and sum(e >= 0.20 for e in three_hop) >= 2,
        "grpo_em_minus_sft_more": over_baseline,
    }


def summarise(out: Path, grpo_run: str = "grpo", world_seed: int | None = None) -> dict[str, Any]:
    runs = [p for p in out.glob("seed*") if p.is_dir() and p.name.removeprefix("seed").isdigit()]
    runs.sort(key=lambda p: int(p.name.removeprefix("seed")))
    summary: dict[str, Any] = {"seeds": [run.name.removeprefix("seed") for run in runs], "grpo_run": grpo_run}
    folders = {"base": "base", "sft": "sft", "grpo": grpo_run, BASELINE: BASELINE}
    per_seed = []
    for run in runs:
        figures = {
            stage: stage_figures(last_eval(run, folder)) | sampled_figures(run, folder)
            for stage, folder in folders.items()
        }
        (run / f"summary{suffix(grpo_run)}.json").write_text(json.dumps(figures, indent=1))
        per_seed.append(figures)
    keys = sorted({k for figures in per_seed for stage in figures.values() for k in stage})
    for stage in folders:
        summary[stage] = {k: [figures[stage].get(k) for figures in per_seed] for k in keys}
        summary[stage]["mean_std"] = {k: mean_std(summary[stage][k]) for k in keys}
    summary["targets"] = targets(summary)
    if world_seed is not None:
        from rlf_envs.tasks.deepsearch.kind_claims import false_kind_claims_in_chat
        from rlf_envs.tasks.deepsearch.world_builder import generate_world

        world = generate_world(world_seed)
        hops_of = {q.id: q.hops for q in world.questions}

        def false_claims(row: dict[str, Any]) -> int:  # judged on the transcript: older runs too
            return false_kind_claims_in_chat(world, row["task_id"], row.get("transcript", []))

        summary["train"] = {}
        for run in runs:
            samples = read_jsonl(run / grpo_run / "train_samples.jsonl")
            if samples:
                steps = max(r["step"] for r in samples)
                by_hops = train_by_hops(samples, hops_of, steps, false_claims)
                summary["train"][run.name.removeprefix("seed")] = by_hops
    return summary


GREEDY_COLUMNS = [("em", "EM (all)"), ("em_hops1", "EM 1-hop"), ("em_hops2", "EM 2-hop"),
                  ("em_hops3", "EM 3-hop"), ("em_multihop", "EM 2-3 hop"),
                  ("searches_per_episode", "searches / episode"), ("tool_error_rate", "tool errors / call")]  # fmt: skip
SAMPLED_COLUMNS = [("avg4", "avg@4 (all)"), ("pass4", "pass@4 (all)")] + [
    (f"{key}_hops{h}", f"{name} {h}-hop")
    for h in HOPS
    for key, name in (("avg4", "avg@4"), ("pass4", "pass@4"))
]


def table(summary: dict[str, Any], cols: list[tuple[str, str]] = GREEDY_COLUMNS) -> str:
    """The markdown table of ``cols`` (default: greedy EM; :data:`SAMPLED_COLUMNS`: T=1 avg@4/pass@4)."""
    names = {"base": "base SmolLM2-135M-Instruct", "sft": "after SFT", "grpo": "after GRPO",
             BASELINE: "SFT + as many more SFT steps (baseline)"}  # fmt: skip
    lines = ["| stage | " + " | ".join(c for _, c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for stage in (*STAGES, BASELINE):
        cells = []
        for key, _ in cols:
            stats = summary[stage]["mean_std"].get(key)
            per = ", ".join("-" if v is None else f"{v:.3f}" for v in summary[stage].get(key, []))
            if stats is None:
                cells.append("not run")
            elif stats["seeds"] < 2:  # no spread from one seed
                cells.append(f"{stats['mean']:.3f} (1 seed: {per})")
            else:
                cells.append(f"{stats['mean']:.3f} +- {stats['std']:.3f} ({per})")
        if cols is SAMPLED_COLUMNS and all(cell == "not run" for cell in cells):
            continue  # a stage without T=1 evals: no row
        lines.append(f"| {names[stage]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(out: Path, summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4), dpi=100)
    for seed in summary["seeds"]:
        rows = [
            r
            for r in read_jsonl(out / f"seed{seed}" / summary["grpo_run"] / "metrics.jsonl")
            if "reward/mean" in r
        ]
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["reward/mean"] for r in rows], marker="o", markersize=3, label=f"seed {seed}")
        axes[1].plot(steps, [r["tool_calls_per_episode"] for r in rows], marker="o", markersize=3,
                     label=f"seed {seed}")  # fmt: skip
        axes[2].plot(steps, [r.get("answered_rate", 0.0) for r in rows], marker="o", markersize=3,
                     label=f"answered, seed {seed}")  # fmt: skip
        if any("guidance/guided_share" in r for r in rows):
            axes[2].plot(steps, [r.get("guidance/guided_share", 0.0) for r in rows], "--", marker="x",
                         markersize=3, label=f"guided groups, seed {seed}")  # fmt: skip
    axes[0].set(
        title=f"GRPO train reward ({summary['grpo_run']}, T=1)",
        xlabel="GRPO step",
        ylabel="mean of 16 episodes",
    )
    axes[1].set(title="GRPO searches per episode", xlabel="GRPO step")
    axes[2].set(title="GRPO: answered share, guided share of groups", xlabel="GRPO step", ylim=(-0.03, 1.03))
    styles = ["-", "--", ":", "-."]
    for i, seed in enumerate(summary["seeds"]):
        for hop, colour in zip(HOPS, ("tab:blue", "tab:orange", "tab:green"), strict=True):
            values = [summary[stage][f"em_hops{hop}"][i] for stage in STAGES]
            xs = [x for x, v in enumerate(values) if v is not None]
            axes[3].plot(xs, [values[x] for x in xs], styles[i % 4], color=colour, marker="o",
                         label=f"{hop}-hop, seed {seed}")  # fmt: skip
    axes[3].set(title="greedy EM on the test sample, per hop count", ylabel="EM", ylim=(-0.03, 1.03))
    axes[3].set_xticks(range(len(STAGES)), ["base", "after SFT", "after GRPO"])
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def copy_runs(out: Path, docs: Path, summary: dict[str, Any]) -> None:
    """Each seed's metrics and base eval into docs/learning_runs (the files docs/learning.md cites)."""
    for seed in summary["seeds"]:
        run = out / f"seed{seed}"
        if (run / "base_eval.json").exists():
            shutil.copyfile(run / "base_eval.json", docs / f"deepsearch_seed{seed}_base_eval.json")
        for folder in ("sft", summary["grpo_run"], BASELINE):
            metrics = run / folder / "metrics.jsonl"
            # a stage that never reached a checkpoint is rerun from its start: nothing of it to keep
            kept = any((run / folder / "checkpoints").glob("step_*")) or (run / folder / "model").is_dir()
            if metrics.exists() and kept:
                shutil.copyfile(metrics, docs / f"deepsearch_seed{seed}_{folder}_metrics.jsonl")
    for name in report_files(summary["grpo_run"]):
        shutil.copyfile(out / name, docs / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the runs folder (OUT of scripts/learning_runs.sh deepsearch)")
    parser.add_argument("--machine", default="", help="recorded in the summary: where the runs ran")
    parser.add_argument("--copy-to", type=Path, help="also copy the summary, PNG and per-seed files here")
    parser.add_argument("--grpo-run", default="grpo", help="the GRPO run folder in each seed (GRPO_NAME)")
    parser.add_argument(
        "--world-seed", type=int, default=0, help="the generated world of the runs (train table)"
    )
    args = parser.parse_args()
    summary = summarise(args.out, args.grpo_run, args.world_seed)
    if args.machine:
        summary["machine"] = args.machine
    summary_name, curves_name = report_files(args.grpo_run)
    (args.out / summary_name).write_text(json.dumps(summary, indent=1))
    plot(args.out, summary, args.out / curves_name)
    if args.copy_to:
        copy_runs(args.out, args.copy_to, summary)
    print(table(summary))
    if any(summary[stage]["mean_std"].get("avg4") for stage in (*STAGES, BASELINE)):
        print("\nT=1, 4 samples a question (rlf-eval):\n" + table(summary, SAMPLED_COLUMNS))
    if summary.get("train"):
        print("\n" + train_table(summary["train"]))
    print(json.dumps(summary["targets"], indent=1))


if __name__ == "__main__":
    main()
