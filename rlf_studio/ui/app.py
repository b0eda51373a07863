"""The whole page: a project picker feeding seven tabs (see docs/studio.md).

The open project and the Train form live in the browser's local storage (``gr.BrowserState``),
so reloading the page keeps both; every page load lists the projects afresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr

from rlf_studio.ui import tab_data, tab_playground, tab_projects, tab_reward, tab_runs, tab_tools, tab_train
from rlf_studio.ui.common import Studio

CSS = """
.rlf-mono textarea { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; }
.rlf-status { min-height: 1.5em; }
.rlf-msg pre { white-space: pre-wrap; margin: 2px 0; }
.rlf-flag { color: #b45309; }
"""

TABS = [
    ("Projects", "projects", tab_projects),
    ("Tools", "tools", tab_tools),
    ("Data", "data", tab_data),
    ("Reward", "reward", tab_reward),
    ("Playground", "playground", tab_playground),
    ("Train", "train", tab_train),
    ("Runs", "runs", tab_runs),
]


def _restore_form(values: Any, size: int) -> tuple[Any, ...]:
    """The saved Train form's values, or no change when nothing (or an older form) was saved."""
    if isinstance(values, list) and len(values) == size:
        return tuple(values)
    return (gr.skip(),) * size


def build_app(project_root: str | Path) -> tuple[gr.Blocks, Studio]:
    """The Gradio app and its server-side state (close it with ``studio.close()``)."""
    studio = Studio(Path(project_root))
    with gr.Blocks(title="RLF Studio") as app:
        project_state = gr.State("")
        saved_project = gr.BrowserState("", storage_key="rlf-studio-project")
        saved_form = gr.BrowserState(None, storage_key="rlf-studio-train-form")
        with gr.Row():
            gr.Markdown("# RLF Studio\nTools, tasks, reward, playground, training and runs: no code.")
            current = gr.Markdown("No project open.", elem_id="current-project")
        built: dict[str, Any] = {}
        with gr.Tabs():
            for label, tab_id, module in TABS:
                with gr.Tab(label, id=tab_id, elem_id=f"tab-{tab_id}") as tab:
                    built[tab_id] = module.build(studio, project_state)
                if tab_id == "runs":
                    tab.select(built["runs"].on_tab_select, project_state, built["runs"].refreshed)
        project_state.change(
            lambda p: f"**Project:** `{p}`" if p else "No project open.", project_state, current
        )
        project_state.change(lambda p: p, project_state, saved_project)
        form = built["train"].widgets
        gr.on(
            [w.change for w in form],
            lambda *v: list(v),
            form,
            saved_form,
            show_progress="hidden",
            trigger_mode="always_last",
        )  # the last change is the one to keep
        app.load(built["projects"].on_page_load, saved_project, built["projects"].outputs)
        app.load(lambda v: _restore_form(v, len(form)), saved_form, form)
    return app, studio
