"""Train tab: a form over the trainer config; preview / save / load; start, abort and resume a run.

Start checks what the config loader allows but cannot train (no steps, no turns, a group of one,
a model folder that does not exist) and whether the token budget holds a whole episode: the
longest prompt, every turn and the tool results between them (:mod:`rlf_studio.budget`), before
any process starts. The live view shows the state, elapsed time, ETA and the trainer's tripped
health checks (:mod:`rlf_studio.run_health`), and one curve panel per metric (metrics of different
scales never share an axis).
"""

from __future__ import annotations

import dataclasses
import html
import time
from pathlib import Path
from typing import Any

import gradio as gr
import yaml

from rlf_studio.budget import BudgetError, check_budget
from rlf_studio.plots import chart_html
from rlf_studio.project import check_name
from rlf_studio.run_health import duration_words, health_words, pace_words, tripped_checks
from rlf_studio.runner import RunProcess, log_tail, state_label
from rlf_studio.runs import curve_rows, latest_summary, progress
from rlf_studio.training import (
    ALGORITHM_CHOICES,
    ENV_CHOICES,
    PREPARED_MODELS,
    PROJECT_ENV,
    SIMULATED_ENV,
    TrainConfigError,
    TrainForm,
    check_config,
    command,
    command_text,
    config_dict,
    load_form,
    run_env,
    save_config,
    start_problems,
)
from rlf_studio.ui.common import Studio, error, guarded, ok, status_box, stopped

FORM_SIZE = len(dataclasses.fields(TrainForm))
STEPS_FIELD = [f.name for f in dataclasses.fields(TrainForm)].index("max_steps")
# one panel per metric: a length in the thousands would flatten a reward in [0, 1] on a shared axis
LIVE_METRICS = ["reward/mean", "accuracy", "tool_calls_per_episode", "response_length"]


def _form_widgets() -> list[Any]:
    d = TrainForm()
    with gr.Row():
        model = gr.Textbox(d.model, label=f"model: a folder, a hub id, or {' / '.join(PREPARED_MODELS)}",
                           elem_id="train-model", scale=3)  # fmt: skip
        run_name = gr.Textbox(d.run_name, label="run name", elem_id="train-run", scale=1)
    with gr.Row():
        loss = gr.Dropdown(list(ALGORITHM_CHOICES), value=d.loss, label="algorithm / loss (sft: supervised "
                           "fine-tuning on the SFT data)", elem_id="train-loss")  # fmt: skip
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
    with gr.Row():
        env_id = gr.Dropdown(list(ENV_CHOICES), value=d.env_id, label="environment (RLF/ToolUse-v0: this "
                             "project's tools, tasks and reward; the others bring their own)", elem_id="train-env",
                             scale=2)  # fmt: skip
        sim_url = gr.Textbox(d.sim_base_url, label=f"user simulator endpoint ({SIMULATED_ENV}; empty: scripted)",
                             elem_id="train-sim-url")  # fmt: skip
        sim_model = gr.Textbox(d.sim_model, label="user simulator model", elem_id="train-sim-model")
    sft_data = gr.Textbox(d.sft_data, label="SFT data (algorithm sft): a chat-messages JSONL, e.g. from "
                          "rlf-collect (docs/sft.md); relative to the project folder", elem_id="train-sft-data")  # fmt: skip
    return [model, run_name, loss, group, prompts, lr, steps, turns, new_tokens, total_tokens, beta, backend,
            launcher, accel, eval_every, ckpt_every, env_id, sim_url, sim_model, sft_data]  # fmt: skip


def progress_html(run: RunProcess, run_dir: Path, max_steps: int) -> str:
    """The live view's head: state, step, elapsed time and ETA, the last numbers, tripped health checks."""
    done, total = progress(run_dir, max_steps)
    state = run.status()
    label = state_label(state) + ("" if state in ("running", "finished", "aborted") else f" ({state})")
    elapsed = (time.time() if run.running else run.ended_at()) - run.started_at
    pace = pace_words(elapsed, done, total) if run.running else f"took {duration_words(elapsed)}"
    health = health_words(tripped_checks(run_dir))
    warn = f"<div class='rlf-flag' id='train-health'>health: {html.escape(health)}</div>" if health else ""
    return (f"<div id='train-progress-text'>{label}: step {done}/{total}, {pace}</div>"
            f"<progress value='{done}' max='{max(total, 1)}' style='width:100%'></progress>"
            f"<div>{html.escape(latest_summary(run_dir))}</div>{warn}")  # fmt: skip


def final_message(run: RunProcess, name: str) -> str:
    """The status line once a run has ended, worded like the progress head."""
    state = run.status()
    if state == "finished":
        return ok(f"run {name!r} finished")
    if state == "aborted":
        return stopped(f"run {name!r} aborted")
    return error(f"run {name!r} {state}")


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
        with gr.Accordion("config YAML (follows the form)", open=False):
            self.config_view = gr.Code(language="yaml", interactive=False, elem_id="train-config-yaml")

    def _live_view(self) -> None:
        self.run_state = gr.State("")
        self.bar = gr.HTML("", elem_id="train-progress")
        with gr.Row():
            self.curves = [gr.HTML("", elem_id=f"train-curve-{i}") for i in range(len(LIVE_METRICS))]
        self.log = gr.Textbox(
            label="log (tail)", lines=10, max_lines=10, interactive=False, elem_id="train-log"
        )
        self.timer = gr.Timer(1.5, active=False)

    def _wire(self, project_state: gr.State) -> None:
        form = [project_state, *self.widgets]
        launched = [self.status, self.cmd, self.run_state, self.timer, self.config_view, self.configs]
        self.preview.click(self.on_preview, form, [self.status, self.cmd, self.config_view])
        self.save.click(self.on_save, form, [self.status, self.configs, self.cmd, self.config_view])
        self.load.click(self.on_load, [project_state, self.configs], [self.status, *self.widgets])
        self.start.click(self.on_start, form, launched)
        self.resume.click(self.on_resume, form, launched)
        stopped_view = [self.status, self.bar, self.timer]
        self.abort.click(self.on_abort, [self.run_state, self.widgets[STEPS_FIELD]], stopped_view)
        live = [self.bar, *self.curves, self.log, self.status, self.timer]
        self.timer.tick(self.on_tick, [self.run_state, self.widgets[STEPS_FIELD]], live)
        project_state.change(self.on_project, project_state, self.configs)
        # the YAML panel always shows the config of the form as it is now, never an older one
        gr.on([project_state.change, *(w.change for w in self.widgets)], self.on_form_change, form,
              self.config_view, trigger_mode="always_last", show_progress="hidden")  # fmt: skip

    def form_config(self, path: str, values: tuple[Any, ...]) -> tuple[Any, TrainForm, dict[str, Any]]:
        project = self.studio.project(path)
        form = TrainForm.from_values(list(values))
        return project, form, check_config(config_dict(project, form))

    def on_form_change(self, path: str, *values: Any) -> str:
        if not path:
            return "# open a project first (Projects tab)"
        try:
            return yaml.safe_dump(self.form_config(path, values)[2], sort_keys=False)
        except Exception as exc:  # the form is half-typed: say why there is no config yet
            return f"# not a valid config yet: {exc}"

    @guarded(3)
    def on_preview(self, path: str, *values: Any) -> tuple[Any, ...]:
        project, form, data = self.form_config(path, values)
        target = project.configs_dir / f"{form.run_name}.yaml"
        return (
            ok("the config is valid"),
            command_text(command(target, form)),
            yaml.safe_dump(data, sort_keys=False),
        )

    @guarded(4)
    def on_save(self, path: str, *values: Any) -> tuple[Any, ...]:
        project, form, data = self.form_config(path, values)
        target = save_config(project, data)
        choices = gr.update(choices=project.configs(), value=form.run_name)
        text = yaml.safe_dump(data, sort_keys=False)
        return ok(f"saved {target}"), choices, command_text(command(target, form)), text

    @guarded(1 + FORM_SIZE)
    def on_load(self, path: str, name: str) -> tuple[Any, ...]:
        if not name:
            raise ValueError("pick a saved config")
        form = load_form(self.studio.project(path), name)
        return (ok(f"loaded {name}"), *form.values())

    def checked_before_start(self, path: str, form: TrainForm, data: dict[str, Any]) -> str:
        """Raise for a run that cannot train; else the budget numbers in words."""
        problems = start_problems(form, data)
        if problems:
            raise TrainConfigError("; ".join(problems) + " (no run started)")
        # the project's own tools: the results seen in the Tools and Playground tabs are theirs
        seen = self.studio.longest_tool_result(path) if data["env"]["id"] == PROJECT_ENV else None
        try:
            report = check_budget(form.model, data, tool_result=seen)
        except BudgetError as exc:
            raise TrainConfigError(f"{exc} (no run started)") from None
        if report is None:
            return "token budget: the model's tokenizer is not on this machine yet; the trainer checks it"
        if report.problem():
            raise TrainConfigError(f"{report.problem()} (no run started)")
        return report.words()

    def launch(self, path: str, values: tuple[Any, ...], resuming: bool) -> tuple[Any, ...]:
        try:
            project, form, data = self.form_config(path, values)
        except TrainConfigError as exc:
            raise TrainConfigError(f"{exc} (no run started)") from None
        run_dir = project.runs_dir / check_name(form.run_name, "run")
        current = self.studio.runs.get(str(run_dir))
        if current is not None and current.running:
            raise ValueError(f"run {form.run_name!r} is already running")
        has_checkpoint = (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())
        if resuming and not has_checkpoint:
            raise ValueError(f"run {form.run_name!r} has no checkpoint to resume from: press Start")
        if not resuming and (has_checkpoint or (run_dir / "metrics.jsonl").exists()):
            raise ValueError(f"run {form.run_name!r} already exists: press Resume, or pick a new run name")
        budget = self.checked_before_start(path, form, data)
        argv = command(save_config(project, data), form)
        self.studio.runs[str(run_dir)] = RunProcess.start(argv, run_dir, run_env(project), cwd=project.root)
        verb = "resumed" if resuming else "started"
        configs = gr.update(choices=project.configs(), value=form.run_name)  # the config it just saved
        return (ok(f"{verb} run {form.run_name!r} ({budget})"), command_text(argv), str(run_dir),
                gr.Timer(active=True), yaml.safe_dump(data, sort_keys=False), configs)  # fmt: skip

    @guarded(6)
    def on_start(self, path: str, *values: Any) -> tuple[Any, ...]:
        return self.launch(path, values, resuming=False)

    @guarded(6)
    def on_resume(self, path: str, *values: Any) -> tuple[Any, ...]:
        return self.launch(path, values, resuming=True)

    @guarded(3)
    def on_abort(self, run_dir: str, steps: float) -> tuple[Any, ...]:
        run = self.studio.runs.get(run_dir or "")
        if run is None:
            return error("no run was started from this page: nothing to abort"), gr.skip(), gr.skip()
        name = Path(run_dir).name
        if not run.running:
            ended = f"run {name!r} had already ended ({state_label(run.status())}): nothing to abort"
            return ok(ended), gr.skip(), gr.skip()
        # SIGTERM to its process group, SIGKILL after a short grace: a few seconds at most. This answer
        # says the end; a timer tick in flight does not say it again over the next button's words
        run.abort()
        bar = progress_html(run, Path(run_dir), int(steps or 0))
        return final_message(run, name), bar, gr.Timer(active=False)

    def on_tick(self, run_dir: str, steps: float) -> tuple[Any, ...]:
        run = self.studio.runs.get(run_dir or "")
        if run is None:
            return (gr.skip(),) * (3 + len(self.curves)) + (gr.Timer(active=False),)
        folder = Path(run_dir)
        plots = [chart_html(curve_rows({folder.name: folder}, [key]), key) for key in LIVE_METRICS]
        final = final_message(run, folder.name) if run.claim_end_message() else gr.skip()
        bar = progress_html(run, folder, int(steps or 0))
        return bar, *plots, log_tail(folder, 25), final, gr.Timer(active=run.running)

    def on_project(self, path: str) -> Any:
        return gr.update(choices=self.studio.project(path).configs() if path else [], value=None)


def build(studio: Studio, project_state: gr.State) -> TrainTab:
    return TrainTab(studio, project_state)
