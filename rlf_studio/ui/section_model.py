"""The Runs tab's "use a trained model" section: serve a run's model, evaluate it on a split, chat."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from rlf_envs.ports import free_local_port
from rlf_studio.policy import EPISODE_COLUMNS, chat_once, play_episodes, serve_model
from rlf_studio.training import run_env
from rlf_studio.ui.common import Studio, error, guarded, ok, status_box


class ModelSection:
    """The section's widgets (built in the page's current block) and its handlers."""

    def __init__(self, studio: Studio, project_state: gr.State, run: gr.Dropdown) -> None:
        self.studio = studio
        gr.Markdown(
            "### Use a trained model\nServe the picked run's `model/` folder with `rlf-serve` (or type any "
            "OpenAI-compatible endpoint), then evaluate it on a split of the project's env or chat with it. "
            "The Playground's *Let a model play* takes the same URL."
        )
        self._widgets()
        self._wire(project_state, run)

    def _widgets(self) -> None:
        with gr.Row():
            self.serve = gr.Button("Serve the run's model", elem_id="serve-start")
            self.stop = gr.Button("Stop serving", elem_id="serve-stop")
            self.folder = gr.Textbox(label="or another model folder", placeholder="default: the run's model/",
                                     elem_id="serve-folder")  # fmt: skip
            self.url = gr.Textbox(label="endpoint base URL", elem_id="serve-url")
            self.model = gr.Textbox(label="model name", elem_id="serve-model")
        self.status = status_box("serve-status")
        with gr.Row():
            self.split = gr.Radio(["test", "train"], value="test", label="split", elem_id="eval-split")
            self.count = gr.Number(4, label="episodes", precision=0, minimum=1, elem_id="eval-n")
            self.turns = gr.Number(2, label="max turns", precision=0, minimum=1, elem_id="eval-turns")
            self.evaluate = gr.Button("Evaluate", variant="primary", elem_id="eval-run")
        self.table = gr.Dataframe(headers=EPISODE_COLUMNS, label="episodes", elem_id="eval-table", wrap=True)
        self.chat = gr.Chatbot(label="chat with the model (no tools)", height=260, elem_id="chat-box")
        with gr.Row():
            self.message = gr.Textbox(label="message", scale=4, elem_id="chat-input")
            self.send = gr.Button("Send", elem_id="chat-send", scale=1)

    def _wire(self, project_state: gr.State, run: gr.Dropdown) -> None:
        self.serve.click(
            self.on_serve, [project_state, run, self.folder], [self.status, self.url, self.model]
        )
        self.stop.click(self.on_stop, [project_state, run, self.folder], self.status)
        evaluated = [project_state, self.url, self.model, self.split, self.count, self.turns]
        self.evaluate.click(self.on_evaluate, evaluated, [self.status, self.table])
        chatted = [self.url, self.model, self.chat, self.message]
        self.send.click(self.on_chat, chatted, [self.chat, self.status, self.message])

    @guarded(3)
    def on_serve(self, path: str, name: str, folder: str) -> tuple[Any, ...]:
        project = self.studio.project(path)
        if not name and not (folder or "").strip():
            raise ValueError("pick a run above, or give a model folder")
        key = (folder or "").strip() or name
        model_dir = (
            Path(folder.strip()).expanduser() if (folder or "").strip() else project.runs_dir / name / "model"
        )
        log_dir = model_dir.parent if model_dir.name == "model" else project.root / "serving"
        old = self.studio.servers.pop(key, None)
        if old is not None:
            old.abort(grace_s=5)
        process, base_url, served = serve_model(model_dir, log_dir, free_local_port(), run_env(project))
        self.studio.servers[key] = process
        return ok(f"serving {served!r} at {base_url}"), base_url, served

    @guarded(1)
    def on_stop(self, path: str, name: str, folder: str) -> str:
        self.studio.project(path)
        process = self.studio.servers.pop((folder or "").strip() or (name or ""), None)
        if process is None:
            return error("that model is not being served")
        return ok(f"model server {process.abort(grace_s=5)}")

    @guarded(2)
    def on_evaluate(
        self, path: str, base_url: str, name: str, split: str, n: float, turns: float
    ) -> tuple[Any, ...]:
        if not base_url or not name:
            raise ValueError("serve a model first, or type an endpoint URL and a model name")
        rows, summary = play_episodes(self.studio.project(path), base_url.strip(), name.strip(), split=split,
                                      limit=int(n or 1), max_turns=int(turns or 2))  # fmt: skip
        return ok(summary), pd.DataFrame(rows, columns=EPISODE_COLUMNS)

    @guarded(3, 1)
    def on_chat(self, base_url: str, name: str, history: list[dict[str, Any]], text: str) -> tuple[Any, ...]:
        if not base_url or not name:
            raise ValueError("serve a model first, or type an endpoint URL and a model name")
        return chat_once(base_url.strip(), name.strip(), list(history or []), text or ""), ok("answered"), ""


def build(studio: Studio, project_state: gr.State, run: gr.Dropdown) -> ModelSection:
    return ModelSection(studio, project_state, run)
