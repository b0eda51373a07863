"""Plot of a compare report: env-steps/s against num_envs, one line per driver (matplotlib, Agg).

Example:
    >>> report = run_compare(BenchSettings(latency_ms=100), [16, 64, 256])   # doctest: +SKIP
    >>> plot_compare(report, "docs/benchmarks_envs.png")                     # doctest: +SKIP
    PosixPath('docs/benchmarks_envs.png')

CLI (from a saved report, e.g. the ``--json`` line of ``rlf-bench env --compare``)::

    python -m rlf_bench.plot sweep_http.json sweep_stdio.json --out docs/benchmarks_envs.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def series(report: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """``{driver: [(num_envs, steps_per_s), ...]}`` sorted by num_envs; rows without a figure are left out."""
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in report["rows"]:
        if row.get("steps_per_s"):
            points[row["driver"]].append((int(row["num_envs"]), float(row["steps_per_s"])))
    return {driver: sorted(values) for driver, values in points.items()}


# one colour per driver in every panel
COLOURS = {
    "rlf vector env": "C0",
    "rlf sequential loop": "C1",
    "rlf astep_one": "C2",
    "gem": "C3",
    "verifiers": "C4",
}


def _draw(ax: Any, report: dict[str, Any], title: str | None) -> None:
    import matplotlib.ticker

    lines = series(report)
    if not lines:
        raise ValueError("the report has no steps/s figure to plot")
    s = report["settings"]
    machine = report.get("machine", {})
    for driver, points in lines.items():
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs,
            ys,
            marker="o",
            label=driver,
            color=COLOURS.get(driver),
            linewidth=2.2 if driver.startswith("rlf vector") else 1.2,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({n for pts in lines.values() for n, _ in pts}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("num_envs (episodes stepped together)")
    ax.set_ylabel("env-steps/s (one tool call each)")
    ax.set_title(
        title
        or f"{s['latency_ms']:g} ms tool latency, rlf over {s['transport']} x{s['replicas']}, "
        f"{machine.get('cpus', '?')}-CPU box",
        fontsize=9,
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def plot_compare(
    report: dict[str, Any] | Sequence[dict[str, Any]],
    path: str | os.PathLike[str],
    title: str | None = None,
) -> Path:
    """Write the PNG (one panel per report) and return its path. Raises ValueError if a report has no figure."""
    reports = [report] if isinstance(report, dict) else list(report)
    with png_figure(path, len(reports)) as (fig, axes):
        for ax, one in zip(axes, reports, strict=True):
            _draw(ax, one, title if len(reports) == 1 else None)
        if title and len(reports) > 1:
            fig.suptitle(title)
    return Path(path)


@contextlib.contextmanager
def png_figure(
    path: str | os.PathLike[str], panels: int, *, width: float = 6.5, height: float = 4.5
) -> Iterator[tuple[Any, list[Any]]]:
    """A figure of ``panels`` side by side; written to ``path`` (folders made) when the block ends.

    The figure is closed either way; nothing is written if the block raises.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width * panels, height), dpi=120, squeeze=False)
    try:
        yield fig, list(axes[0])
        fig.tight_layout()
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    finally:
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="plot a compare report (JSON) as a PNG")
    parser.add_argument(
        "reports",
        nargs="+",
        help="JSON files of run_compare reports (or files whose last line is one); one panel each",
    )
    parser.add_argument("--out", required=True, help="PNG path to write")
    args = parser.parse_args(argv)
    reports = []
    for name in args.reports:
        text = Path(name).read_text(encoding="utf-8").strip()
        try:
            reports.append(json.loads(text))
        except json.JSONDecodeError:  # a captured CLI run: the report is its last line
            reports.append(json.loads(text.splitlines()[-1]))
    print(plot_compare(reports, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
