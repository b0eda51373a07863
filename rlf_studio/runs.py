"""The Runs tab's backend (and the Train tab's live view): a run folder's metrics and rollouts.

Reads what the trainer writes (docs/trainer.md): ``metrics.jsonl`` (one line of scalars per step)
and ``train_samples.jsonl`` (episodes of each step with their transcript and reward).

Example:
    >>> import json, tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> _ = (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\\n")
    >>> curve_rows({"r": run}, ["reward/mean"])
    [{'step': 1, 'value': 0.5, 'series': 'r: reward/mean'}]
    >>> progress(run, 4)
    (1, 4)
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rlf_trainer.observe.jsonl_records import parse_record

CURVE_KEYS = ("reward/mean", "accuracy", "tool_calls_per_episode", "kl", "response_length", "eval/reward")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The parseable lines of a JSONL file (a line being written right now is skipped)."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [record for line in lines if (record := parse_record(line)) is not None]


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(run_dir / "metrics.jsonl")


def metric_keys(run_dirs: list[Path]) -> list[str]:
    """Every scalar a set of runs logged, the usual curves first."""
    keys = {k for run in run_dirs for row in metrics(run) for k in row if k != "step"}
    return [k for k in CURVE_KEYS if k in keys] + sorted(keys - set(CURVE_KEYS))


def curve_rows(runs: dict[str, Path], keys: list[str]) -> list[dict[str, Any]]:
    """Long-format rows (step, value, series) for a line plot of ``keys`` over ``runs``."""
    rows = []
    for name, run_dir in runs.items():
        for record in metrics(run_dir):
            for key in keys:
                if key in record and "step" in record:
                    rows.append(
                        {"step": int(record["step"]), "value": float(record[key]), "series": f"{name}: {key}"}
                    )
    return rows


def progress(run_dir: Path, max_steps: int) -> tuple[int, int]:
    """(last logged step, max steps)."""
    steps = [int(r["step"]) for r in metrics(run_dir) if "step" in r]
    return (max(steps) if steps else 0), max_steps


def latest_summary(run_dir: Path) -> str:
    """The last step's headline numbers as one line of Markdown."""
    rows = metrics(run_dir)
    if not rows:
        saved = len(read_jsonl(run_dir / "train_samples.jsonl"))
        return f"{saved} saved episode(s), no training metrics" if saved else "no step logged yet"
    last = rows[-1]
    shown = [f"{k} {last[k]:.3f}" for k in CURVE_KEYS if k in last]
    return f"step {last.get('step')}: " + ", ".join(shown)


def sample_steps(run_dir: Path) -> list[int]:
    return sorted({int(r["step"]) for r in read_jsonl(run_dir / "train_samples.jsonl") if "step" in r})


def _transcript_html(transcript: list[dict[str, Any]]) -> str:
    parts = []
    for message in transcript:
        role = message.get("role", "?")
        if role == "system":
            continue
        content = html.escape(str(message.get("content") or ""))
        calls = message.get("tool_calls") or []
        call_text = "".join(
            f"<div class='rlf-call'>tool call: <b>{html.escape(str(c.get('function', {}).get('name')))}</b> "
            f"{html.escape(json.dumps(c.get('function', {}).get('arguments'), ensure_ascii=False))}</div>"
            for c in calls
        )
        label = f"tool result ({html.escape(str(message.get('name')))})" if role == "tool" else role
        parts.append(f"<div class='rlf-msg rlf-{role}'><i>{label}</i><pre>{content}</pre>{call_text}</div>")
    return "".join(parts)


def rollouts_html(run_dir: Path, step: int) -> str:
    """The logged episodes of one step as HTML: each group side by side, each episode turn by turn."""
    samples = [r for r in read_jsonl(run_dir / "train_samples.jsonl") if int(r.get("step", -1)) == int(step)]
    if not samples:
        return f"<p>No rollouts logged for step {step}.</p>"
    groups: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for sample in samples:
        groups[sample.get("group")].append(sample)
    out = [f"<p>step {step}: {len(samples)} episode(s) in {len(groups)} group(s)</p>"]
    for group, episodes in groups.items():
        rewards = [float(e.get("reward") or 0.0) for e in episodes]
        mean = sum(rewards) / len(rewards)
        flag = (
            " <b class='rlf-flag'>zero variance: no learning signal</b>"
            if len(set(rewards)) == 1 and len(rewards) > 1
            else ""
        )
        out.append(
            f"<h4>group {html.escape(str(group))}: {html.escape(str(episodes[0].get('prompt')))}{flag}</h4>"
        )
        out.append("<div class='rlf-group' style='display:flex;gap:8px;align-items:flex-start'>")
        for episode in episodes:
            reward = float(episode.get("reward") or 0.0)
            head = (f"reward {reward:.3f} (r - group mean {reward - mean:+.3f}), {episode.get('turns')} turn(s), "
                    f"{episode.get('tool_calls')} tool call(s), {html.escape(str(episode.get('finish_reason')))}")  # fmt: skip
            out.append(
                f"<div class='rlf-episode' style='flex:1;border:1px solid #ccc;padding:4px'><p>{head}</p>"
            )
            out.append(_transcript_html(episode.get("transcript") or []) + "</div>")
        out.append("</div>")
    return "".join(out)
