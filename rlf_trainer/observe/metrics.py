"""Per-step numbers from a rollout batch, the run's metrics history, sample files and the learning curve.

Example:
    >>> history = MetricsHistory()
    >>> history.add(1, {"reward/mean": 0.25})
    >>> history.add(2, {"reward/mean": 0.5, "eval/reward": 0.4})
    >>> history.series("reward/mean")
    ([1, 2], [0.25, 0.5])
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlf_trainer.observe.jsonl_records import parse_record
from rlf_trainer.rollout.trajectory import EpisodeStats


def rollout_metrics(stats: Sequence[EpisodeStats], prefix: str = "") -> dict[str, float]:
    """Reward, accuracy, tool use, turns, lengths and finish reasons of a batch's episodes.

    ``accuracy`` (share of episodes whose ``em``/``acc`` counts as correct) and ``answered_rate``
    appear only when the env reports them. ``tool_error_rate`` is errors per tool call.

    Example:
        >>> rollout_metrics([EpisodeStats(task_id="0", group=0, reward=1.0, tool_calls=2, tool_errors=1)])["tool_error_rate"]
        0.5
    """
    if not stats:
        return {}
    rewards = np.array([s.reward for s in stats], dtype=np.float64)
    calls = sum(s.tool_calls for s in stats)
    errors = sum(s.tool_errors for s in stats)
    out = {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std()),
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "tool_calls_per_episode": calls / len(stats),
        "tool_error_rate": errors / calls if calls else 0.0,
        "turns": float(np.mean([s.turns for s in stats])),
        "response_length": float(np.mean([s.response_length for s in stats])),
        "total_length": float(np.mean([s.total_length for s in stats])),
    }
    correct = [s.correct for s in stats if s.correct is not None]
    if correct:
        out["accuracy"] = float(np.mean(correct))
    answered = [s.answered for s in stats if s.answered is not None]
    if answered:
        out["answered_rate"] = float(np.mean(answered))
    if any(s.user_turns or s.sim_error for s in stats):  # dialogue envs (a user simulator)
        out["user_turns"] = float(np.mean([s.user_turns for s in stats]))
        flagged = Counter(s.sim_error for s in stats if s.sim_error)
        out["sim_errors"] = float(sum(flagged.values()))
        for kind, count in sorted(flagged.items()):
            out[f"sim_errors/{kind}"] = float(count)
    reasons = Counter(s.finish_reason for s in stats)
    for reason, count in sorted(reasons.items()):
        out[f"finish/{reason}"] = count / len(stats)
    out |= health_inputs(stats)
    return {f"{prefix}{key}": value for key, value in out.items()}


def grouped_metrics(stats: Sequence[EpisodeStats], key: str, prefix: str = "eval/") -> dict[str, float]:
    """Accuracy, reward and tool use per value of task metadata ``key`` (e.g. DeepSearch's ``hops``).

    Example:
        >>> s = [EpisodeStats("a", 0, reward=1.0, correct=True, task_metadata={"hops": 1}),
        ...      EpisodeStats("b", 0, reward=0.0, correct=False, tool_calls=2, task_metadata={"hops": 2})]
        >>> m = grouped_metrics(s, "hops")
        >>> m["eval/hops=1/accuracy"], m["eval/hops=2/tool_calls_per_episode"], m["eval/hops=2/episodes"]
        (1.0, 2.0, 1.0)
    """
    groups: dict[str, list[EpisodeStats]] = {}
    for s in stats:
        if key in s.task_metadata:
            groups.setdefault(str(s.task_metadata[key]), []).append(s)
    out: dict[str, float] = {}
    for value, members in sorted(groups.items()):
        part = rollout_metrics(members)
        head = f"{prefix}{key}={value}/"
        out[f"{head}episodes"] = float(len(members))
        for name in ("reward/mean", "accuracy", "tool_calls_per_episode", "tool_error_rate", "turns"):
            if name in part:
                out[head + ("reward" if name == "reward/mean" else name)] = part[name]
    return out


def eval_prompt_indices(num_tasks: int, count: int, seed: int) -> list[int]:
    """A seeded sample of ``count`` of ``num_tasks`` test prompts, in split order (the same every eval).

    Example:
        >>> eval_prompt_indices(10, 4, seed=0) == eval_prompt_indices(10, 4, seed=0)
        True
        >>> eval_prompt_indices(3, 8, seed=0)
        [0, 1, 2]
    """
    if count >= num_tasks:
        return list(range(num_tasks))
    picked = np.random.default_rng([seed, 0xE7A1]).choice(num_tasks, size=count, replace=False)
    return sorted(int(i) for i in picked)


def health_inputs(stats: Sequence[EpisodeStats]) -> dict[str, float]:
    """What the health checks (:mod:`rlf_trainer.observe.health`) read besides the metrics above.

    ``prompt_length`` (mean, ``/max``); ``silent_at_budget``: share of episodes that hit
    ``max_total_tokens`` before generating a token; ``truncated_turns``: share of turns cut at
    ``max_new_tokens``; ``tool_errors/<kind>`` and ``repeated_tool_calls`` per tool call;
    ``sim_error_rate``; ``reward_info/<key>``: mean of each numeric reward component;
    ``reward/off_goal_share``: the share of the (positive) reward earned by episodes whose
    ``em``/``acc`` says they missed the goal.

    Example:
        >>> ok = EpisodeStats(task_id="0", group=0, reward=1.0, correct=True, reward_info={"em": 1.0})
        >>> formatted = EpisodeStats(task_id="1", group=0, reward=0.5, correct=False, reward_info={"em": 0.0})
        >>> health_inputs([ok, formatted])["reward/off_goal_share"]
        0.3333333333333333
    """
    out = {
        "prompt_length": float(np.mean([s.prompt_length for s in stats])),
        "prompt_length/max": float(max(s.prompt_length for s in stats)),
        "silent_at_budget": float(
            np.mean([s.finish_reason == "max_total_tokens" and s.response_length == 0 for s in stats])
        ),
    }
    turns = [reason for s in stats for reason in s.turn_finish_reasons]
    if turns:
        out["truncated_turns"] = turns.count("length") / len(turns)
    calls = sum(s.tool_calls for s in stats)
    if calls:
        for kind, count in sorted(Counter(k for s in stats for k in s.error_kinds).items()):
            out[f"tool_errors/{kind}"] = count / calls
        repeats = sum(len(s.tool_call_keys) - len(set(s.tool_call_keys)) for s in stats)
        out["repeated_tool_calls"] = repeats / calls
    if any(s.sim_error for s in stats):
        out["sim_error_rate"] = float(np.mean([bool(s.sim_error) for s in stats]))
    components: dict[str, list[float]] = {}
    for s in stats:
        for key, value in s.reward_info.items():
            if key != "reward" and isinstance(value, int | float) and math.isfinite(value):
                components.setdefault(key, []).append(float(value))
    out |= {f"reward_info/{key}": float(np.mean(values)) for key, values in sorted(components.items())}
    judged = [(max(s.reward, 0.0), s.correct) for s in stats if s.correct is not None]
    earned = sum(r for r, _ in judged)
    if earned > 0:
        out["reward/off_goal_share"] = sum(r for r, correct in judged if not correct) / earned
    return out


class MetricsHistory:
    """Every logged step's scalars, kept to rewrite ``metrics.jsonl`` and draw the curve (also after a resume)."""

    def __init__(self, records: list[dict[str, Any]] | None = None) -> None:
        self.records: list[dict[str, Any]] = list(records or [])

    def add(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if self.records and self.records[-1]["step"] == step:
            self.records[-1].update(clean)
        else:
            self.records.append({"step": step, **clean})

    def series(self, key: str) -> tuple[list[int], list[float]]:
        points = [(r["step"], r[key]) for r in self.records if key in r]
        return [p[0] for p in points], [p[1] for p in points]

    def write_jsonl(self, path: str | os.PathLike[str]) -> None:
        write_lines_atomically(path, [json.dumps(record) for record in self.records])


def plot_learning_curve(history: MetricsHistory, path: str | os.PathLike[str], title: str = "") -> Path:
    """A PNG of reward mean per training step (with its std band) and eval reward, via matplotlib's Agg."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    steps, means = history.series("reward/mean")
    if steps:
        ax.plot(steps, means, marker="o", markersize=3, label="train reward (mean)")
        std_steps, stds = history.series("reward/std")
        if std_steps == steps:
            low = np.array(means) - np.array(stds)
            high = np.array(means) + np.array(stds)
            ax.fill_between(steps, low, high, alpha=0.15)
    eval_steps, eval_rewards = history.series("eval/reward")
    if eval_steps:
        ax.plot(eval_steps, eval_rewards, marker="s", markersize=4, label="eval reward")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title or "learning curve")
    ax.grid(alpha=0.3)
    if steps or eval_steps:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def sample_records(
    stats_list: Sequence[EpisodeStats],
    transcripts: Sequence[list[dict[str, Any]]],
    *,
    step: int,
    limit: int,
    kind: str,
) -> list[dict[str, Any]]:
    """The first ``limit`` episodes as JSON records: prompt, transcript, reward and stats."""
    records = []
    for stats, transcript in list(zip(stats_list, transcripts, strict=True))[:limit]:
        prompt = next((m.get("content") for m in transcript if m.get("role") == "user"), None)
        records.append(
            {
                "kind": kind,
                "step": step,
                "task_id": stats.task_id,
                "group": stats.group,
                "prompt": prompt,
                "transcript": _jsonable(transcript),
                "reward": stats.reward,
                "reward_info": _jsonable(stats.reward_info),
                "turns": stats.turns,
                "tool_calls": stats.tool_calls,
                "finish_reason": stats.finish_reason,
                "response_length": stats.response_length,
                "user_turns": stats.user_turns,
                "sim_error": stats.sim_error,
                "demonstration": stats.demonstration,
                "weights_version": stats.weights_version,
            }
        )
    return records


def append_jsonl(path: str | os.PathLike[str], records: list[dict[str, Any]]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def drop_records_after(path: str | os.PathLike[str], step: int) -> int:
    """Remove the lines of a samples JSONL logged after ``step``; returns how many went.

    A run resumed from an earlier checkpoint logs those steps again, so without this the file
    would hold two versions of them. A line cut short (the process died mid-write, e.g. on a full
    disk) is dropped too: it was being logged after the last checkpoint.

        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "s.jsonl"
        >>> append_jsonl(path, [{"step": 1}, {"step": 2}, {"step": 3}])
        >>> drop_records_after(path, 1), path.read_text()
        (2, '{"step": 1}\\n')
        >>> with open(path, "a") as f:
        ...     _ = f.write('{"step": 2, "transcr')
        >>> drop_records_after(path, 1), path.read_text()
        (1, '{"step": 1}\\n')
    """
    path = Path(path)
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [
        line for line in lines if (record := parse_record(line)) is not None and record.get("step", 0) <= step
    ]
    if len(kept) < len(lines):
        write_lines_atomically(path, kept)
    return len(lines) - len(kept)


def write_lines_atomically(path: str | os.PathLike[str], lines: list[str]) -> None:
    """``path`` holds ``lines`` afterwards, one a line; a reader sees the old file or the new one, never half."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)
