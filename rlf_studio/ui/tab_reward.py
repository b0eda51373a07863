"""Reward tab: pick built-ins (or a python file), weight them, preview on sample answers, save."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import pandas as pd

from rlf_studio.data import load_tasks
from rlf_studio.policy import EPISODE_COLUMNS, play_episodes
from rlf_studio.rewards import BUILTINS, load_spec, preview
from rlf_studio.ui.common import Studio, error, guarded, ok, status_box

SAMPLE_COLUMNS = ["question", "gold answer", "model response"]
RESULT_COLUMNS = [*SAMPLE_COLUMNS, "reward", "details"]
DEFAULT_SAMPLES = [
    ["What is the capital of France?", "Paris", "<answer>Paris</answer>"],
    ["What is the capital of France?", "Paris", "I think it is <answer>Lyon</answer>"],
    ["What is the capital of France?", "Paris", "Paris"],
]


def _spec(
    names: list[str], weights: list[float], judge: list[str], python: list[str], sql_seed: float
) -> dict[str, Any]:
    weight_of = dict(zip(BUILTINS, weights, strict=True))
    return {
        "components": [{"name": n, "weight": float(weight_of[n] if weight_of[n] is not None else 1.0)} for n in names],
        "judge": {"base_url": judge[0].strip(), "model": judge[1].strip(), "prompt_template": judge[2] or None,
                  "score_parser": judge[3]},
        "python": {"file": python[0].strip(), "function": (python[1] or "reward").strip()},
        "sql": {"seed": int(sql_seed or 0)},
    }  # fmt: skip


def _samples(value: Any) -> list[list[Any]]:
    if isinstance(value, pd.DataFrame):
        return value.fillna("").values.tolist()
    return list(value or [])


class RewardTab:
    """The tab's widgets (built in the page's current block) and its handlers."""

    def __init__(self, studio: Studio, project_state: gr.State) -> None:
        self.studio = studio
        gr.Markdown(
            "The episode reward: the weighted sum of the checked rewards (e.g. 0.9 exact_match + 0.1 format). "
            "`python` imports **your** file's function `f(episode) -> float | dict` (the only user code the "
            "studio runs)."
        )
        self.widgets = self._spec_widgets()
        self.save = gr.Button("Save reward", variant="primary", elem_id="reward-save")
        self.status = status_box("reward-status")
        self._preview_widgets()
        self._wire(project_state)

    def _spec_widgets(self) -> list[Any]:
        names = gr.CheckboxGroup(
            list(BUILTINS), value=["exact_match"], label="Rewards", elem_id="reward-names"
        )
        with gr.Row():
            weights = [
                gr.Number(1.0, label=f"weight: {n}", elem_id=f"reward-weight-{n}", min_width=100)
                for n in BUILTINS
            ]
        with gr.Accordion("LLM judge (for `judge`)", open=False):
            with gr.Row():
                url = gr.Textbox(
                    label="endpoint base URL", placeholder="http://127.0.0.1:8000/v1", elem_id="judge-url"
                )
                model = gr.Textbox(label="judge model", elem_id="judge-model")
                parser = gr.Radio(["score_tag", "yes_no"], value="score_tag", label="verdict format")
            prompt = gr.Textbox(
                label="prompt template ({question}, {gold}, {answer}); empty: the default", lines=3
            )
        with gr.Accordion("Python reward file (for `python`)", open=True), gr.Row():
            py_file = gr.Textbox(
                label="file (.py)", placeholder="/path/to/my_reward.py", elem_id="reward-file"
            )
            py_fn = gr.Textbox("reward", label="function", elem_id="reward-function")
        with gr.Accordion("SQL execution match (for `sql`: gold answers are SQL queries)", open=False):
            sql_seed = gr.Number(0, label="seed of the generated database (the bundled sqlite server's)",
                                 precision=0, elem_id="reward-sql-seed")  # fmt: skip
        return [names, *weights, url, model, prompt, parser, py_file, py_fn, sql_seed]

    def _preview_widgets(self) -> None:
        gr.Markdown("### Preview on sample answers")
        self.samples = gr.Dataframe(pd.DataFrame(DEFAULT_SAMPLES, columns=SAMPLE_COLUMNS), interactive=True,
                                    label="samples (edit freely)", elem_id="reward-samples", wrap=True)  # fmt: skip
        with gr.Row():
            self.fill = gr.Button("Fill from the project's tasks", elem_id="reward-fill")
            self.run_preview = gr.Button("Preview reward", elem_id="reward-preview")
        self.preview_status = status_box("reward-preview-status")
        self.results = gr.Dataframe(
            headers=RESULT_COLUMNS, label="scores", elem_id="reward-results", wrap=True
        )
        title = "Preview on real rollouts of a policy (the saved reward, any OpenAI-compatible endpoint)"
        with gr.Accordion(title, open=False):
            with gr.Row():
                self.policy = [
                    gr.Textbox(label="policy base URL", placeholder="http://127.0.0.1:8000/v1",
                               elem_id="reward-policy-url"),
                    gr.Textbox(label="policy model", elem_id="reward-policy-model"),
                    gr.Number(4, label="episodes", precision=0, minimum=1, elem_id="reward-policy-n"),
                ]  # fmt: skip
                self.policy_run = gr.Button("Roll out and score", elem_id="reward-rollouts")
            self.rollouts = gr.Dataframe(headers=EPISODE_COLUMNS, label="rollouts", elem_id="reward-rollout-table",
                                         wrap=True)  # fmt: skip

    def _wire(self, project_state: gr.State) -> None:
        self.save.click(self.on_save, [project_state, *self.widgets], self.status)
        self.run_preview.click(
            self.on_preview, [self.samples, *self.widgets], [self.preview_status, self.results]
        )
        self.fill.click(self.on_fill, project_state, [self.preview_status, self.samples])
        self.policy_run.click(
            self.on_rollouts, [project_state, *self.policy], [self.preview_status, self.rollouts]
        )
        project_state.change(self.on_project, project_state, self.widgets)

    @staticmethod
    def spec_of(values: tuple[Any, ...]) -> dict[str, Any]:
        n = len(BUILTINS)
        return _spec(
            values[0],
            list(values[1 : n + 1]),
            list(values[n + 1 : n + 5]),
            list(values[n + 5 : n + 7]),
            values[n + 7],
        )

    @guarded(1)
    def on_save(self, path: str, *values: Any) -> str:
        project = self.studio.project(path)
        spec = self.spec_of(values)
        # a spec that does not build (unknown name, broken file) or raises on a sample is never saved
        _, errors = preview(spec, DEFAULT_SAMPLES[:1])
        if errors:
            return error(f"{errors[0]} (nothing saved)")
        project.write_json(project.reward_path, spec)
        parts = " + ".join(f"{c['weight']:g} {c['name']}" for c in spec["components"])
        return ok(f"saved {project.reward_path.name}: {parts}")

    @guarded(2)
    def on_preview(self, table: Any, *values: Any) -> tuple[Any, ...]:
        rows, errors = preview(self.spec_of(values), _samples(table))
        message = error("; ".join(errors)) if errors else ok(f"scored {len(rows)} sample(s)")
        return message, pd.DataFrame(rows, columns=RESULT_COLUMNS)

    @guarded(2)
    def on_fill(self, path: str) -> tuple[Any, ...]:
        tasks = load_tasks(self.studio.project(path))[:3]
        if not tasks:
            raise ValueError("the project has no tasks yet: save some in the Data tab")
        rows = []
        for task in tasks:
            gold = task.get("answer")
            gold_text = json.dumps(gold) if isinstance(gold, list) else str(gold)
            first = gold[0] if isinstance(gold, list) and gold else gold
            rows += [
                [task["question"], gold_text, f"<answer>{first}</answer>"],
                [task["question"], gold_text, "<answer>no idea</answer>"],
            ]
        return ok(f"{len(rows)} samples from the project's tasks"), pd.DataFrame(rows, columns=SAMPLE_COLUMNS)

    @guarded(2)
    def on_rollouts(self, path: str, base_url: str, model: str, n: float) -> tuple[Any, ...]:
        if not base_url or not model:
            raise ValueError(
                "give the policy's endpoint URL and model name (rlf-serve --model PATH serves one)"
            )
        project = self.studio.project(path)
        rows, summary = play_episodes(
            project, base_url.strip(), model.strip(), split="train", limit=int(n or 1)
        )
        return ok(summary), pd.DataFrame(rows, columns=EPISODE_COLUMNS)

    def on_project(self, path: str) -> tuple[Any, ...]:
        if not path:
            return (gr.skip(),) * len(self.widgets)
        spec = load_spec(self.studio.project(path).reward_path)
        chosen = {c["name"]: c.get("weight", 1.0) for c in spec.get("components", [])}
        judge, python = spec.get("judge") or {}, spec.get("python") or {}
        return (
            [n for n in chosen if n in BUILTINS],
            *[chosen.get(n, 1.0) for n in BUILTINS],
            judge.get("base_url", ""), judge.get("model", ""), judge.get("prompt_template") or "",
            judge.get("score_parser", "score_tag"), python.get("file", ""), python.get("function", "reward"),
            (spec.get("sql") or {}).get("seed", 0),
        )  # fmt: skip


def build(studio: Studio, project_state: gr.State) -> RewardTab:
    return RewardTab(studio, project_state)
