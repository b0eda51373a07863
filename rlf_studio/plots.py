"""One metric's curves as a small inline SVG chart: no plotting library, no script in the page.

The Train and Runs tabs draw one panel per metric, each on its own y-axis (a length in the
thousands never flattens a reward in [0, 1]). Gradio's own line plot renders through Vega-Lite
and fills the browser console with warnings (its spec's schema version, the infinite extent of an
empty plot); a static SVG in an HTML block has neither, and costs nothing to redraw on each tick.

Example:
    >>> rows = [{"step": 1, "value": 0.2, "series": "a: reward/mean"},
    ...         {"step": 2, "value": 0.6, "series": "a: reward/mean"}]
    >>> svg = chart_html(rows, "reward/mean")
    >>> "<polyline" in svg and "reward/mean" in svg and "0.6" in svg
    True
    >>> chart_html([], "accuracy")
    "<div class='rlf-chart'><b>accuracy</b><p>no accuracy logged yet</p></div>"
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Any

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")
WIDTH, HEIGHT = 360, 190
LEFT, RIGHT, TOP, BOTTOM = 52, 10, 10, 26  # room for the axis labels


def _series(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Finite (step, value) points per series, in step order."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        step, value = float(row["step"]), float(row["value"])
        if math.isfinite(step) and math.isfinite(value):
            points[str(row["series"])].append((step, value))
    return {name: sorted(pts) for name, pts in points.items()}


def _span(values: list[float]) -> tuple[float, float]:
    """(low, high) with room when every value is the same."""
    low, high = min(values), max(values)
    if high > low:
        return low, high
    pad = abs(low) * 0.1 or 0.5
    return low - pad, high + pad


def _number(value: float) -> str:
    return f"{value:.4g}"


def chart_html(rows: list[dict[str, Any]], title: str) -> str:
    """``rows`` (``step``, ``value``, ``series``: :func:`rlf_studio.runs.curve_rows`) as one chart."""
    series = _series(rows)
    name = html.escape(title)
    if not series:
        return f"<div class='rlf-chart'><b>{name}</b><p>no {name} logged yet</p></div>"
    (x0, x1) = _span([x for pts in series.values() for x, _ in pts])
    (y0, y1) = _span([y for pts in series.values() for _, y in pts])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def xy(x: float, y: float) -> tuple[float, float]:
        return round(LEFT + (x - x0) / (x1 - x0) * plot_w, 1), round(TOP + (y1 - y) / (y1 - y0) * plot_h, 1)

    bottom, right = TOP + plot_h, LEFT + plot_w
    parts = [
        f"<line x1='{LEFT}' y1='{TOP}' x2='{LEFT}' y2='{bottom}' stroke='#9ca3af'/>",
        f"<line x1='{LEFT}' y1='{bottom}' x2='{right}' y2='{bottom}' stroke='#9ca3af'/>",
        f"<text x='{LEFT - 4}' y='{TOP + 8}' text-anchor='end'>{_number(y1)}</text>",
        f"<text x='{LEFT - 4}' y='{bottom}' text-anchor='end'>{_number(y0)}</text>",
        f"<text x='{LEFT}' y='{HEIGHT - 8}'>step {_number(x0)}</text>",
        f"<text x='{right}' y='{HEIGHT - 8}' text-anchor='end'>{_number(x1)}</text>",
    ]
    legend = []
    for i, (label, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        pixels = [xy(x, y) for x, y in pts]
        line = " ".join(f"{px},{py}" for px, py in pixels)
        parts.append(f"<polyline points='{line}' fill='none' stroke='{color}' stroke-width='2'/>")
        parts += [f"<circle cx='{px}' cy='{py}' r='2.5' fill='{color}'/>" for px, py in pixels]
        legend.append(f"<span style='color:{color}'>&#9632; {html.escape(label)}</span>")
    svg = (
        f"<svg viewBox='0 0 {WIDTH} {HEIGHT}' width='100%' role='img' aria-label='{name}' "
        f"style='font:11px sans-serif;fill:currentColor'>{''.join(parts)}</svg>"
    )
    return f"<div class='rlf-chart'><b>{name}</b><div>{' '.join(legend)}</div>{svg}</div>"
