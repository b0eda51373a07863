"""The whole page: a project picker feeding seven tabs (see docs/studio.md)."""

from __future__ import annotations

from pathlib import Path

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


def build_app(project_root: str | Path) -> tuple[gr.Blocks, Studio]:
    """The Gradio app and its server-side state (close it with ``studio.close()``)."""
    studio = Studio(Path(project_root))
    with gr.Blocks(title="RLF Studio") as app:
        project_state = gr.State("")
        with gr.Row():
            gr.Markdown("# RLF Studio\nTools, tasks, reward, playground, training and runs: no code.")
            current = gr.Markdown("No project open.", elem_id="current-project")
        with gr.Tabs():
            for label, tab_id, module in TABS:
                with gr.Tab(label, id=tab_id, elem_id=f"tab-{tab_id}"):
                    module.build(studio, project_state)
        project_state.change(
            lambda p: f"**Project:** `{p}`" if p else "No project open.", project_state, current
        )
    return app, studio
