"""Plot of ``rlf-bench rollout`` reports: wall seconds of lockstep, async and the ideal critical path.

One group of bars per report (e.g. one per ``--max-new-tokens``), and, where a report has its
``train_step`` part, a second panel with the GRPO step time without and with overlap.

CLI (from the ``--json`` last lines of saved runs)::

    python -m rlf_bench.rollout_plot rollout_32.txt rollout_128.txt --out docs/benchmarks_rollout.png
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlf_bench.plot import png_figure


def bar_values(report: dict[str, Any]) -> dict[str, float]:
    """The three wall times of one report, in seconds.

    Example:
        >>> bar_values({"lockstep": {"wall_s": 9.0}, "async": {"wall_s": 4.0}, "ideal_s": 3.5})
        {'lockstep': 9.0, 'async': 4.0, 'ideal': 3.5}
    """
    return {
        "lockstep": report["lockstep"]["wall_s"],
        "async": report["async"]["wall_s"],
        "ideal": report["ideal_s"],
    }


def _label(report: dict[str, Any]) -> str:
    s = report["settings"]
    return f"{s['max_new_tokens']} tokens/turn"


def plot_rollout(reports: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write the PNG and return its path."""
    steps = [r["train_step"] for r in reports if "train_step" in r]
    with png_figure(path, 1 + bool(steps)) as (_, axes):
        _draw_rollouts(axes[0], reports)
        if steps:
            _draw_steps(axes[1], reports)
    return Path(path)


def _draw_rollouts(ax: Any, reports: Sequence[dict[str, Any]]) -> None:
    width = 0.8 / 3
    for k, name in enumerate(("lockstep", "async", "ideal")):
        values = [bar_values(r)[name] for r in reports]
        xs = [i + (k - 1) * width for i in range(len(reports))]
        ax.bar(xs, values, width, label=name)
        for x, v in zip(xs, values, strict=True):
            ax.annotate(f"{v:.1f}", (x, v), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(reports)), [_label(r) for r in reports])
    s = reports[0]["settings"]
    ax.set_ylabel("wall seconds for the batch (lower is better)")
    ax.set_title(
        f"{s['episodes']} episodes x {s['tool_turns']} tool turns, {s['latency_dist']} "
        f"{s['latency_ms']:g} ms (sigma {s['sigma']:g})",
        fontsize=10,
    )
    ax.legend()


def _draw_steps(ax: Any, reports: Sequence[dict[str, Any]]) -> None:
    with_steps = [r for r in reports if "train_step" in r]
    for i, report in enumerate(with_steps):
        for k, arm in enumerate(("sequential", "overlap")):
            value = report["train_step"][arm]["time/step"]
            x = i + (k - 0.5) * 0.4
            ax.bar(x, value, 0.4, color=f"C{3 + k}", label=arm if i == 0 else None)
            ax.annotate(f"{value:.1f}", (x, value), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(with_steps)), [_label(r) for r in with_steps])
    ax.set_ylabel("seconds per GRPO step (median, steps 2..N)")
    ax.set_title("train step: rollout.overlap off vs on", fontsize=10)
    ax.legend()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="plot rlf-bench rollout reports as a PNG")
    parser.add_argument("reports", nargs="+", help="files whose last line is a rollout report (--json)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    reports = [json.loads(Path(n).read_text(encoding="utf-8").strip().splitlines()[-1]) for n in args.reports]
    print(plot_rollout(reports, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
