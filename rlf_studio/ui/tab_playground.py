"""Playground tab: play an episode of the project's env, typing the assistant turns or asking a model."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from rlf_studio.playground import EpisodeSession
from rlf_studio.ui.common import Studio, guarded, ok, status_box


def _session(studio: Studio, path: str) -> EpisodeSession:
    session = studio.episodes.get(str(studio.project(path).root))
    if session is None:
        raise ValueError("press New episode first")
    return session


class PlaygroundTab:
    """The tab's widgets (built in the page's current block) and its handlers."""

    def __init__(self, studio: Studio, project_state: gr.State) -> None:
        self.studio = studio
        gr.Markdown(
            "An episode of `RLF/ToolUse-v0` with the project's servers, tasks and reward: the env training "
            'uses. Call a tool with `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; answer with '
            "`<answer>...</answer>`."
        )
        self._widgets()
        self._wire(project_state)

    def _widgets(self) -> None:
        with gr.Row():
            self.task_index = gr.Number(0, label="task index", precision=0, minimum=0, elem_id="play-task")
            self.max_turns = gr.Number(4, label="max turns", precision=0, minimum=1, elem_id="play-turns")
            self.reset = gr.Button("New episode", variant="primary", elem_id="play-reset")
        self.status = status_box("play-status")
        self.chat = gr.Chatbot(label="Episode", height=420, elem_id="play-chat")
        with gr.Row():
            self.action = gr.Textbox(label="Assistant turn", lines=3, scale=4, elem_id="play-action")
            with gr.Column(scale=1):
                self.send = gr.Button("Send turn", variant="primary", elem_id="play-send")
                self.template = gr.Button("Insert tool-call template", size="sm", elem_id="play-template")
                self.save = gr.Button("Save episode to Runs", size="sm", elem_id="play-save")
        with gr.Accordion("Let a model play (any OpenAI-compatible endpoint)", open=False), gr.Row():
            self.url = gr.Textbox(
                label="base URL", placeholder="http://127.0.0.1:8000/v1", elem_id="play-url"
            )
            self.model = gr.Textbox(label="model", elem_id="play-model")
            self.model_turn = gr.Button("Model's turn", elem_id="play-model-turn")

    def _wire(self, project_state: gr.State) -> None:
        turn = [self.status, self.chat, self.action]
        self.reset.click(
            self.on_reset, [project_state, self.task_index, self.max_turns], [self.status, self.chat]
        )
        self.send.click(self.on_send, [project_state, self.action], turn)
        self.model_turn.click(self.on_model, [project_state, self.url, self.model], turn)
        self.template.click(self.on_template, project_state, [self.status, self.action])
        self.save.click(self.on_save, project_state, self.status)

    @guarded(2)
    def on_reset(self, path: str, index: float, turns: float) -> tuple[Any, ...]:
        project = self.studio.project(path)
        self.studio.replace_episode(str(project.root), None)
        session = EpisodeSession(project, max_turns=int(turns or 4))
        self.studio.replace_episode(str(project.root), session)
        message = session.reset(int(index or 0))
        return ok(message), session.chat()

    def stepped(self, path: str, session: EpisodeSession, text: str) -> str:
        """Play the turn ``text``; its tool results count towards Start's room for tool results."""
        message = session.step(text)
        for result in session.tool_results():
            self.studio.saw_tool_result(path, result)
        return message

    @guarded(3)
    def on_send(self, path: str, text: str) -> tuple[Any, ...]:
        session = _session(self.studio, path)
        message = self.stepped(path, session, text or "")
        return ok(message), session.chat(), ""

    @guarded(3)
    def on_model(self, path: str, base_url: str, name: str) -> tuple[Any, ...]:
        session = _session(self.studio, path)
        text = session.model_turn(base_url.strip(), name.strip())
        message = self.stepped(path, session, text)
        return ok(f"the model said {len(text)} characters; {message}"), session.chat(), ""

    @guarded(2)
    def on_template(self, path: str) -> tuple[Any, ...]:
        session = _session(self.studio, path)
        if not session.tools:
            raise ValueError("this env has no tools")
        fn = session.tools[0]["function"]
        props = (fn.get("parameters") or {}).get("properties") or {}
        args = {k: v.get("default", "") for k, v in props.items()}
        return gr.skip(), f"<tool_call>{json.dumps({'name': fn['name'], 'arguments': args})}</tool_call>"

    @guarded(1)
    def on_save(self, path: str) -> str:
        return ok(_session(self.studio, path).save(self.studio.project(path)))


def build(studio: Studio, project_state: gr.State) -> PlaygroundTab:
    return PlaygroundTab(studio, project_state)
