"""Runs tab: compare the curves of several runs (one panel per metric); browse a run's rollouts step by step.

The run list refreshes whenever the tab is opened, and each run's line names its tripped health checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from rlf_studio.plots import chart_html
from rlf_studio.run_health import health_words, tripped_checks
from rlf_studio.runs import curve_rows, latest_summary, metric_keys, rollouts_html, sample_steps
from rlf_studio.ui import section_model
from rlf_studio.ui.common import Studio, guarded, ok, status_box

MAX_PANELS = 6  # metrics shown at once, one panel (and y-axis) each


def run_line(run_dir: Path) -> str:
    """One run's Markdown line: its last numbers, then any tripped health check in words."""
    health = health_words(tripped_checks(run_dir))
    checks = f"  \n  **health:** {health}" if health else "  \n  health: no check tripped"
    return f"- **{run_dir.name}**: {latest_summary(run_dir)}{checks}"


class RunsTab:
    """The tab's widgets (built in the page's current block) and its handlers."""

    def __init__(self, studio: Studio, project_state: gr.State) -> None:
        self.studio = studio
        self._curves()
        self._rollouts()
        section_model.build(studio, project_state, self.run)
        self._wire(project_state)

    def _curves(self) -> None:
        self.refresh = gr.Button("Refresh runs", elem_id="runs-refresh")
        self.status = status_box("runs-status")
        with gr.Row():
            self.runs = gr.CheckboxGroup([], label="runs to compare", elem_id="runs-select")
            self.keys = gr.Dropdown(["reward/mean"], value=["reward/mean"], multiselect=True, label="metrics",
                                    elem_id="runs-metrics")  # fmt: skip
        self.show = gr.Button("Show curves", variant="primary", elem_id="runs-show")
        with gr.Row():
            self.panels = [gr.HTML("", visible=i == 0, elem_id=f"runs-curve-{i}") for i in range(MAX_PANELS)]
        self.summary = gr.Markdown("", elem_id="runs-summary")

    def _rollouts(self) -> None:
        gr.Markdown("### Rollouts")
        with gr.Row():
            self.run = gr.Dropdown([], label="run", elem_id="rollout-run")
            self.step = gr.Dropdown([], label="step", elem_id="rollout-step")
            self.show_rollouts = gr.Button("Show rollouts", elem_id="rollout-show")
        self.rollouts = gr.HTML("", elem_id="rollout-html")

    def _wire(self, project_state: gr.State) -> None:
        self.refreshed = [self.status, self.runs, self.keys, self.run, self.summary]
        self.refresh.click(self.on_refresh, project_state, self.refreshed)
        project_state.change(self.on_refresh, project_state, self.refreshed)
        self.show.click(self.on_show, [project_state, self.runs, self.keys], [self.status, *self.panels])
        self.run.change(self.on_run, [project_state, self.run], [self.status, self.step])
        shown = [project_state, self.run, self.step]
        self.show_rollouts.click(self.on_rollouts, shown, [self.status, self.rollouts])
        self.step.input(self.on_rollouts, shown, [self.status, self.rollouts])

    @guarded(5)
    def on_refresh(self, path: str) -> tuple[Any, ...]:
        project = self.studio.project(path)
        names = project.runs()
        available = metric_keys([project.runs_dir / n for n in names]) or ["reward/mean"]
        return (
            ok(f"{len(names)} run(s) in {project.name}"),
            gr.update(choices=names, value=names[:1]),
            gr.update(choices=available, value=[k for k in available if k == "reward/mean"] or available[:1]),
            gr.update(choices=names, value=names[0] if names else None),
            "\n".join(run_line(project.runs_dir / n) for n in names),
        )

    def on_tab_select(self, path: str) -> tuple[Any, ...]:
        """Opening the tab lists the runs as they are now (runs started since the project opened too)."""
        if not path:
            return (gr.skip(),) * len(self.refreshed)
        return self.on_refresh(path)

    @guarded(1 + MAX_PANELS)
    def on_show(self, path: str, chosen: list[str], metric_names: list[str]) -> tuple[Any, ...]:
        project = self.studio.project(path)
        if not chosen:
            raise ValueError("tick at least one run")
        keys = list(metric_names or ["reward/mean"])
        if len(keys) > MAX_PANELS:
            raise ValueError(f"pick at most {MAX_PANELS} metrics (one panel each), got {len(keys)}")
        runs = {n: project.runs_dir / n for n in chosen}
        curves = [curve_rows(runs, [key]) for key in keys]
        points = sum(len(rows) for rows in curves)
        if not points:
            raise ValueError("these runs have logged no step of these metrics yet")
        panels = [
            gr.update(value=chart_html(rows, k), visible=True) for rows, k in zip(curves, keys, strict=True)
        ]
        panels += [gr.update(visible=False)] * (MAX_PANELS - len(keys))
        return ok(f"{points} point(s) in {len(keys)} panel(s), one per metric"), *panels

    @guarded(2)
    def on_run(self, path: str, name: str) -> tuple[Any, ...]:
        steps = sample_steps(self.studio.project(path).runs_dir / name) if name else []
        choices = [str(s) for s in steps]
        message = ok(f"{name}: rollouts logged for {len(steps)} step(s)") if name else gr.skip()
        return message, gr.update(choices=choices, value=choices[0] if choices else None)

    @guarded(2)
    def on_rollouts(self, path: str, name: str, step: str) -> tuple[Any, ...]:
        if not name or not step:
            raise ValueError("pick a run and a step")
        page = rollouts_html(self.studio.project(path).runs_dir / name, int(step))
        return ok(f"rollouts of {name}, step {step}"), page


def build(studio: Studio, project_state: gr.State) -> RunsTab:
    return RunsTab(studio, project_state)
