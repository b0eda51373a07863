"""Train tab: a form over the trainer config; preview / save / load; start, abort and resume a run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd
import yaml

from rlf_studio.project import check_name
from rlf_studio.runner import RunProcess, log_tail
from rlf_studio.runs import curve_rows, latest_summary, progress
from rlf_studio.training import (
    PREPARED_MODELS,
    TrainForm,
    check_config,
    command,
    command_text,
    config_dict,
    load_form,
    run_env,
    save_config,
)
from rlf_studio.ui.common import Studio, error, guarded, ok, status_box

FORM_SIZE = len(dataclasses.fields(TrainForm))
LIVE_PLOTS = {
    "reward and accuracy": ["reward/mean", "accuracy", "eval/reward"],
    "tool calls and KL": ["tool_calls_per_episode", "tool_error_rate", "kl"],
    "response length (tokens)": ["response_length"],
}


def _form_widgets() -> list[Any]:
    d = TrainForm()
    with gr.Row():
        model = gr.Textbox(d.model, label=f"model: a folder, a hub id, or {' / '.join(PREPARED_MODELS)}",
                           elem_id="train-model", scale=3)  # fmt: skip
        run_name = gr.Textbox(d.run_name, label="run name", elem_id="train-run", scale=1)
    with gr.Row():
        loss = gr.Dropdown(
            ["grpo", "dr_grpo", "dapo", "gspo"], value=d.loss, label="algorithm / loss", elem_id="train-loss"
        )
        group = gr.Number(d.group_size, label="group size (G)", precision=0, elem_id="train-group")
        prompts = gr.Number(
            d.prompts_per_step, label="prompts per step", precision=0, elem_id="train-prompts"
        )
        lr = gr.Number(d.lr, label="learning rate", elem_id="train-lr")
        steps = gr.Number(d.max_steps, label="steps", precision=0, elem_id="train-steps")
    with gr.Row():
        turns = gr.Number(d.max_turns, label="max turns", precision=0, elem_id="train-turns")
        new_tokens = gr.Number(
            d.max_new_tokens, label="tokens per turn", precision=0, elem_id="train-new-tokens"
        )
        total_tokens = gr.Number(
            d.max_total_tokens, label="tokens per episode", precision=0, elem_id="train-total-tokens"
        )
        beta = gr.Number(d.beta, label="KL beta", elem_id="train-beta")
    with gr.Row():
        backend = gr.Radio(
            ["hf", "vllm"], value=d.backend, label="generation backend", elem_id="train-backend"
        )
        launcher = gr.Radio(
            ["python", "accelerate"], value=d.launcher, label="launcher", elem_id="train-launcher"
        )
        accel = gr.Textbox(
            d.accelerate_config, label="accelerate config file (optional)", elem_id="train-accelerate"
        )
        eval_every = gr.Number(d.eval_every, label="eval every (steps)", precision=0, elem_id="train-eval")
        ckpt_every = gr.Number(
            d.checkpoint_every, label="checkpoint every", precision=0, elem_id="train-ckpt"
        )
    return [model, run_name, loss, group, prompts, lr, steps, turns, new_tokens, total_tokens, beta, backend,
            launcher, accel, eval_every, ckpt_every]  # fmt: skip


def _progress_html(run_dir: Path, max_steps: int, state: str) -> str:
    done, total = progress(run_dir, max_steps)
    return (f"<div id='train-progress-text'>{state}: step {done}/{total}</div>"
            f"<progress value='{done}' max='{max(total, 1)}' style='width:100%'></progress>"
            f"<div>{latest_summary(run_dir)}</div>")  # fmt: skip


class TrainTab:
    """The tab's widgets (built in the page's current block) and its handlers."""

    def __init__(self, studio: Studio, project_state: gr.State) -> None:
        self.studio = studio
        self.widgets = _form_widgets()
        self._buttons()
        self._live_view()
        self._wire(project_state)

    def _buttons(self) -> None:
        with gr.Row():
            self.preview = gr.Button("Preview command", elem_id="train-preview")
            self.save = gr.Button("Save config", elem_id="train-save")
            self.configs = gr.Dropdown([], label="saved configs", elem_id="train-configs")
            self.load = gr.Button("Load config", elem_id="train-load")
        with gr.Row():
            self.start = gr.Button("Start", variant="primary", elem_id="train-start")
            self.abort = gr.Button("Abort", variant="stop", elem_id="train-abort")
            self.resume = gr.Button("Resume", elem_id="train-resume")
        self.status = status_box("train-status")
        self.cmd = gr.Textbox(label="command", interactive=False, elem_id="train-command")
        with gr.Accordion("config YAML", open=False):
            self.config_view = gr.Code(language="yaml", interactive=False, elem_id="train-config-yaml")

    def _live_view(self) -> None:
        self.run_state = gr.State("")
        self.bar = gr.HTML("", elem_id="train-progress")
        with gr.Row():
            self.curves = [
                gr.LinePlot(x="step", y="value", color="series", label=label, elem_id=f"train-curve-{i}")
                for i, label in enumerate(LIVE_PLOTS)
            ]
        self.log = gr.Textbox(
            label="log (tail)", lines=10, max_lines=10, interactive=False, elem_id="train-log"
        )
        self.timer = gr.Timer(1.5, active=False)

    def _wire(self, project_state: gr.State) -> None:
        form = [project_state, *self.widgets]
        launched = [self.status, self.cmd, self.run_state, self.timer]
        self.preview.click(self.on_preview, form, [self.status, self.cmd, self.config_view])
        self.save.click(self.on_save, form, [self.status, self.configs, self.cmd])
        self.load.click(self.on_load, [project_state, self.configs], [self.status, *self.widgets])
        self.start.click(self.on_start, form, launched)
        self.resume.click(self.on_resume, form, launched)
        self.abort.click(self.on_abort, self.run_state, self.status)
        live = [self.bar, *self.curves, self.log, self.status, self.timer]
        self.timer.tick(self.on_tick, [self.run_state, self.widgets[6]], live)
        project_state.change(self.on_project, project_state, self.configs)

    def form_config(self, path: str, values: tuple[Any, ...]) -> tuple[Any, TrainForm, dict[str, Any]]:
        project = self.studio.project(path)
        form = TrainForm.from_values(list(values))
        return project, form, check_config(config_dict(project, form))

    @guarded(3)
    def on_preview(self, path: str, *values: Any) -> tuple[Any, ...]:
        project, form, data = self.form_config(path, values)
        target = project.configs_dir / f"{form.run_name}.yaml"
        return (
            ok("the config is valid"),
            command_text(command(target, form)),
            yaml.safe_dump(data, sort_keys=False),
        )

    @guarded(3)
    def on_save(self, path: str, *values: Any) -> tuple[Any, ...]:
        project, form, data = self.form_config(path, values)
        target = save_config(project, data)
        choices = gr.update(choices=project.configs(), value=form.run_name)
        return ok(f"saved {target}"), choices, command_text(command(target, form))

    @guarded(1 + FORM_SIZE)
    def on_load(self, path: str, name: str) -> tuple[Any, ...]:
        if not name:
            raise ValueError("pick a saved config")
        form = load_form(self.studio.project(path), name)
        return (ok(f"loaded {name}"), *form.values())

    def launch(self, path: str, values: tuple[Any, ...], resuming: bool) -> tuple[Any, ...]:
        project, form, data = self.form_config(path, values)
        run_dir = project.runs_dir / check_name(form.run_name)
        current = self.studio.runs.get(str(run_dir))
        if current is not None and current.running:
            raise ValueError(f"run {form.run_name!r} is already running")
        has_checkpoint = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
        if resuming and not has_checkpoint:
            raise ValueError(f"run {form.run_name!r} has no checkpoint to resume from: press Start")
        if not resuming and (has_checkpoint or (run_dir / "metrics.jsonl").exists()):
            raise ValueError(f"run {form.run_name!r} already exists: press Resume, or pick a new run name")
        argv = command(save_config(project, data), form)
        self.studio.runs[str(run_dir)] = RunProcess.start(argv, run_dir, run_env(project), cwd=project.root)
        verb = "resumed" if resuming else "started"
        return ok(f"{verb} run {form.run_name!r}"), command_text(argv), str(run_dir), gr.Timer(active=True)

    @guarded(4)
    def on_start(self, path: str, *values: Any) -> tuple[Any, ...]:
        return self.launch(path, values, resuming=False)

    @guarded(4)
    def on_resume(self, path: str, *values: Any) -> tuple[Any, ...]:
        return self.launch(path, values, resuming=True)

    @guarded(1)
    def on_abort(self, run_dir: str) -> str:
        run = self.studio.runs.get(run_dir or "")
        if run is None or not run.running:
            return error("no run is running")
        return ok(f"run {Path(run_dir).name!r} {run.abort()}")

    def on_tick(self, run_dir: str, steps: float) -> tuple[Any, ...]:
        run = self.studio.runs.get(run_dir or "")
        if run is None:
            return (gr.skip(),) * (3 + len(self.curves)) + (gr.Timer(active=False),)
        state, folder = run.status(), Path(run_dir)
        plots = [
            pd.DataFrame(curve_rows({folder.name: folder}, keys), columns=["step", "value", "series"])
            for keys in LIVE_PLOTS.values()
        ]
        final = (
            gr.skip()
            if run.running
            else (ok if state == "finished" else error)(f"run {folder.name!r} {state}")
        )
        bar = _progress_html(folder, int(steps or 0), state)
        return bar, *plots, log_tail(folder, 25), final, gr.Timer(active=run.running)

    def on_project(self, path: str) -> Any:
        return gr.update(choices=self.studio.project(path).configs() if path else [], value=None)


def build(studio: Studio, project_state: gr.State) -> TrainTab:
    return TrainTab(studio, project_state)
