"""Runs tab: compare the curves of several runs; browse a run's rollouts step by step."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from rlf_studio.runs import curve_rows, latest_summary, metric_keys, rollouts_html, sample_steps
from rlf_studio.ui import section_model
from rlf_studio.ui.common import Studio, guarded, ok, status_box


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
        self.curve = gr.LinePlot(x="step", y="value", color="series", label="curves", elem_id="runs-curve")
        self.summary = gr.Markdown("", elem_id="runs-summary")

    def _rollouts(self) -> None:
        gr.Markdown("### Rollouts")
        with gr.Row():
            self.run = gr.Dropdown([], label="run", elem_id="rollout-run")
            self.step = gr.Dropdown([], label="step", elem_id="rollout-step")
            self.show_rollouts = gr.Button("Show rollouts", elem_id="rollout-show")
        self.rollouts = gr.HTML("", elem_id="rollout-html")

    def _wire(self, project_state: gr.State) -> None:
        refreshed = [self.status, self.runs, self.keys, self.run, self.summary]
        self.refresh.click(self.on_refresh, project_state, refreshed)
        project_state.change(self.on_refresh, project_state, refreshed)
        self.show.click(self.on_show, [project_state, self.runs, self.keys], [self.status, self.curve])
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
            "\n".join(f"- **{n}**: {latest_summary(project.runs_dir / n)}" for n in names),
        )

    @guarded(2)
    def on_show(self, path: str, chosen: list[str], metric_names: list[str]) -> tuple[Any, ...]:
        project = self.studio.project(path)
        if not chosen:
            raise ValueError("tick at least one run")
        rows = curve_rows({n: project.runs_dir / n for n in chosen}, list(metric_names or ["reward/mean"]))
        if not rows:
            raise ValueError("these runs have logged no step of these metrics yet")
        return ok(f"{len(rows)} point(s)"), pd.DataFrame(rows, columns=["step", "value", "series"])

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
