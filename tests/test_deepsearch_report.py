"""scripts/deepsearch_report.py on run folders written here: the figures docs/learning.md reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("deepsearch_report", REPO / "scripts" / "deepsearch_report.py")
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def eval_row(em: tuple[float, float, float], episodes=(10, 20, 30), searches=1.0) -> dict[str, float]:
    total = sum(episodes)
    row = {"eval/accuracy": sum(e * n for e, n in zip(em, episodes, strict=True)) / total,
           "eval/tool_calls_per_episode": searches, "eval/tool_error_rate": 0.0}  # fmt: skip
    for hop, (e, n) in enumerate(zip(em, episodes, strict=True), start=1):
        row |= {f"eval/hops={hop}/accuracy": e, f"eval/hops={hop}/episodes": float(n)}
    return row


def write_seed(out: Path, seed: int, sft: tuple, grpo: tuple | None) -> None:
    run = out / f"seed{seed}"
    (run / "sft").mkdir(parents=True)
    (run / "base_eval.json").write_text(json.dumps(eval_row((0.0, 0.0, 0.0), searches=0.0)))
    (run / "sft" / "metrics.jsonl").write_text(json.dumps({"step": 36, **eval_row(sft)}) + "\n")
    if grpo is not None:
        (run / "grpo").mkdir()
        rows = [{"step": 1, "reward/mean": 0.1, "tool_calls_per_episode": 1.0},
                {"step": 2, "reward/mean": 0.3, "tool_calls_per_episode": 2.0, **eval_row(grpo, searches=2.0)}]  # fmt: skip
        (run / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_weights_multihop_by_episodes_and_checks_targets_on_complete_seeds(tmp_path: Path) -> None:
    write_seed(tmp_path, 0, sft=(0.9, 0.0, 0.0), grpo=(0.9, 0.5, 0.2))
    write_seed(tmp_path, 1, sft=(0.8, 0.1, 0.0), grpo=(0.7, 0.4, 0.1))
    write_seed(tmp_path, 2, sft=(1.0, 0.0, 0.0), grpo=None)  # GRPO eval not run yet
    summary = report.summarise(tmp_path)

    assert summary["seeds"] == ["0", "1", "2"]
    # 2-3 hop EM weights each hop by its episodes: (0.5 * 20 + 0.2 * 30) / 50
    assert summary["grpo"]["em_multihop"][:2] == pytest.approx([0.32, 0.22])
    assert summary["grpo"]["em"][2] is None
    assert summary["sft"]["mean_std"]["em_hops1"] == pytest.approx({"mean": 0.9, "std": 0.1, "seeds": 3})
    targets = summary["targets"]
    assert targets["seeds"] == ["0", "1"]  # seed 2 has no GRPO eval: left out of the targets
    # EM over all 60 questions: SFT 0.150 and 0.167, GRPO 0.417 and 0.300
    assert targets["grpo_em_minus_sft"] == pytest.approx([0.4167 - 0.15, 0.3 - 0.1667], abs=1e-3)
    assert targets["grpo_worst_hop_minus_sft"] == pytest.approx([0.0, -0.1])  # seed 1 lost 1-hop EM
    assert targets["grpo_em_hops3"] == [0.2, 0.1]
    assert targets["grpo_em_minus_sft_more"] == [None, None]  # no baseline run
    # two complete seeds: no target over "every seed" is met yet
    assert not any(targets[k] for k in targets if k.endswith("_met"))
    assert json.loads((tmp_path / "seed0" / "summary.json").read_text())["grpo"]["em_hops3"] == 0.2

    text = report.table(summary)
    # EM over all 60: (0.9*10 + 0.5*20 + 0.2*30) / 60 = 0.417 and 0.300
    assert "| after GRPO | 0.358 +- " in text and "(0.900, 0.700, -)" in text
    single = tmp_path / "single"
    write_seed(single, 4, sft=(0.9, 0.0, 0.0), grpo=None)
    text = report.table(report.summarise(single))  # one seed has no spread to show
    assert "| after SFT | 0.150 (1 seed: 0.150) |" in text and "| after GRPO | not run |" in text
    report.plot(tmp_path, summary, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_targets_hold_per_seed_on_three_seeds_and_the_baseline_is_read(tmp_path: Path) -> None:
    write_seed(tmp_path, 0, sft=(0.9, 0.0, 0.0), grpo=(0.9, 0.5, 0.2))
    write_seed(tmp_path, 1, sft=(0.9, 0.0, 0.0), grpo=(0.88, 0.4, 0.3))
    write_seed(tmp_path, 2, sft=(0.9, 0.0, 0.0), grpo=(0.9, 0.3, 0.0))
    baseline = tmp_path / "seed1" / "sft_more"
    baseline.mkdir()
    (baseline / "metrics.jsonl").write_text(json.dumps({"step": 16, **eval_row((0.9, 0.1, 0.0))}) + "\n")
    sampled = {"eval/avg@4": 0.4, "eval/pass@4": 0.5, "eval/hops=2/avg@4": 0.25, "eval/hops=2/pass@4": 0.75}
    (tmp_path / "seed0" / "grpo_t1_eval.json").write_text(json.dumps({"metrics": sampled}))
    summary = report.summarise(tmp_path)
    assert summary["grpo"]["pass4_hops2"] == [0.75, None, None]
    assert summary["grpo"]["avg4_hops3"] == [None, None, None]  # not in that report
    sampled_table = report.table(summary, report.SAMPLED_COLUMNS)
    assert "| after GRPO | 0.400 (1 seed: 0.400, -, -) | 0.500 (1 seed" in sampled_table
    assert "after SFT" not in sampled_table  # no T=1 eval of that stage: no row
    targets = summary["targets"]
    assert targets["grpo_em_minus_sft_met"] and targets["grpo_worst_hop_minus_sft_met"]
    assert targets["grpo_em_hops3_met"]  # 0.2 and 0.3: two seeds of three
    assert targets["grpo_em_minus_sft_more"] == pytest.approx([None, (25.8 - 11) / 60, None])
    assert "| SFT + as many more SFT steps (baseline) | 0.183 (1 seed: -, 0.183, -) |" in report.table(
        summary
    )
    from rlf_envs.tasks.deepsearch.world_builder import generate_world

    one_hop = next(q.id for q in generate_world(0).split("train") if q.hops == 1)
    rows = [{"step": step, "task_id": one_hop, "group": 0, "reward": reward, "reward_info": {"em": reward},
             "tool_calls": calls, "demonstration": demo}
            for step, reward, calls, demo in ((1, 1.0, 1, False), (2, 0.0, 2, False), (2, 1.0, 1, True))]  # fmt: skip
    rows[1]["reward_info"]["redundant_searches"] = 1.0  # runs since redundant_search_cost report it
    rows[1]["transcript"] = [{"role": "assistant", "content": "The question asks for a river."}]  # never true
    (tmp_path / "seed0" / "grpo" / "train_samples.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows)
    )
    train = report.summarise(tmp_path, world_seed=0)["train"]
    assert train["0"]["hops1"]["steps 2-2"] == {
        "groups": 1,
        "reward": 0.0,
        "em": 0.0,
        "searches": 2.0,
        "guided": 1.0,
        "redundant": 1.0,
        "false_claims": 1.0,
    }
    table = report.train_table(train)
    assert "| 0 | 1 | 1-1 | 1 | 1.000 | 1.000 | 1.00 | - | 0.00 | 0.00 |" in table
    assert "| 0 | 1 | 2-2 | 1 | 0.000 | 0.000 | 2.00 | 1.00 | 1.00 | 1.00 |" in table
    write_seed(tmp_path / "lost", 0, sft=(0.9, 0.0, 0.0), grpo=(0.8, 0.9, 0.9))
    for seed in (1, 2):
        write_seed(tmp_path / "lost", seed, sft=(0.9, 0.0, 0.0), grpo=(0.9, 0.9, 0.9))
    lost = report.summarise(tmp_path / "lost")["targets"]
    assert lost["grpo_em_minus_sft_met"] and not lost["grpo_worst_hop_minus_sft_met"]  # seed 0: 1-hop -0.1


def test_grpo_run_reads_a_variant_folder_and_copies_its_metrics_under_its_name(tmp_path: Path) -> None:
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    docs.mkdir()
    write_seed(runs, 0, sft=(0.9, 0.0, 0.0), grpo=(0.2, 0.5, 0.5))  # the default folder: grpo/
    (runs / "seed0" / "grpo").rename(runs / "seed0" / "grpo_2to3hops")
    (runs / "seed0" / "grpo_2to3hops" / "model").mkdir()
    write_seed(runs, 1, sft=(0.9, 0.0, 0.0), grpo=(0.1, 0.0, 0.0))  # only the default: not this variant

    summary = report.summarise(runs, "grpo_2to3hops")
    assert summary["grpo_run"] == "grpo_2to3hops"
    assert summary["grpo"]["em_hops1"] == [0.2, None]
    assert report.summarise(runs)["grpo"]["em_hops1"] == [None, 0.1]
    assert (runs / "seed0" / "summary_grpo_2to3hops.json").exists()
    (runs / "deepsearch_summary_grpo_2to3hops.json").write_text(json.dumps(summary))
    report.plot(runs, summary, runs / "deepsearch_curves_grpo_2to3hops.png")
    report.copy_runs(runs, docs, summary)
    assert sorted(p.name for p in docs.iterdir()) == [
        "deepsearch_curves_grpo_2to3hops.png",
        "deepsearch_seed0_base_eval.json",
        "deepsearch_seed0_grpo_2to3hops_metrics.jsonl",
        "deepsearch_seed1_base_eval.json",
        "deepsearch_summary_grpo_2to3hops.json",
    ]


def test_base_eval_is_read_from_an_rlf_eval_report_or_a_bare_metrics_file(tmp_path: Path) -> None:
    row = eval_row((0.5, 0.25, 0.0))
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "base_eval.json").write_text(json.dumps({"metrics": row, "counts": {"episodes": 60}}))
    (tmp_path / "old").mkdir()  # written before rlf-eval: the eval/* metrics alone
    (tmp_path / "old" / "base_eval.json").write_text(json.dumps(row))
    assert report.last_eval(tmp_path / "new", "base") == report.last_eval(tmp_path / "old", "base") == row
