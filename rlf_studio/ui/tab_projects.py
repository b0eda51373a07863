"""Projects tab: create or open a project folder; list the projects and the open one's runs.

:meth:`ProjectsTab.on_page_load` runs on every page load: it lists the projects as they are now
and reopens the project the browser had open before (kept in its local storage), so a reload
never closes the open project.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from rlf_studio.project import Project, ProjectError, create_project, is_project, list_projects, open_project
from rlf_studio.runs import latest_summary
from rlf_studio.ui.common import Studio, guarded, ok, status_box


def _runs_table(project: Project) -> pd.DataFrame:
    rows = [[name, latest_summary(project.runs_dir / name)] for name in project.runs()]
    return pd.DataFrame(rows, columns=["run", "last step"])


def _opened(studio: Studio, project: Project, verb: str) -> tuple[Any, ...]:
    """The outputs for an open ``project``; the status says ``<verb> project '<name>'``."""
    names = [p.name for p in list_projects(studio.root)]
    return (
        ok(f"{verb} project {project.name!r}"),
        str(project.root),
        project.summary(),
        _runs_table(project),
        gr.update(choices=names, value=project.name if project.name in names else None),
    )


OUTPUTS = 5  # the handlers' outputs: ProjectsTab.outputs


class ProjectsTab:
    """The tab's outputs, its buttons' handlers and the page-load handler that restores the open project.

    A plain class, not a dataclass: Gradio keeps the handlers (bound methods) hashed, and a
    dataclass's ``__eq__`` makes its instances unhashable.
    """

    def __init__(self, studio: Studio, outputs: list[Any]) -> None:
        self.studio = studio
        self.outputs = outputs  # status, project state, summary, runs table, project list

    @guarded(OUTPUTS)
    def on_create(self, text: str) -> tuple[Any, ...]:
        # create_project reuses a project of that name (nothing is overwritten): say which it was
        verb = "reopened the existing" if is_project(self.studio.root, text) else "created"
        return _opened(self.studio, create_project(self.studio.root, text), verb)

    @guarded(OUTPUTS)
    def on_open(self, text: str) -> tuple[Any, ...]:
        return _opened(self.studio, open_project(self.studio.root, text), "opened")

    def on_page_load(self, saved_path: str) -> tuple[Any, ...]:
        names = [p.name for p in list_projects(self.studio.root)]
        if saved_path and Path(saved_path).is_dir():
            try:
                return _opened(self.studio, open_project(self.studio.root, saved_path), "reopened")
            except ProjectError:
                pass  # deleted or moved since: start with no project open
        # nothing to say: the status is left alone, so a late page-load answer never erases the
        # answer of a button pressed while the page was loading
        return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.update(choices=names, value=None)


def build(studio: Studio, project_state: gr.State) -> ProjectsTab:
    gr.Markdown(
        f"Projects live in `{studio.root}`. A project folder holds the MCP servers (`mcp.json`), "
        "the tasks, the reward, train configs and runs: everything the other tabs edit."
    )
    with gr.Row():
        name = gr.Textbox(label="Project name", placeholder="my-agent", elem_id="project-name", scale=3)
        create = gr.Button("Create project", variant="primary", elem_id="project-create", scale=1)
        open_button = gr.Button("Open", elem_id="project-open", scale=1)
    existing = gr.Dropdown(
        [p.name for p in list_projects(studio.root)], label="Existing projects", elem_id="project-list"
    )
    status = status_box("project-status")
    summary = gr.Markdown("No project open.", elem_id="project-summary")
    runs = gr.Dataframe(headers=["run", "last step"], label="Runs of this project", elem_id="project-runs")
    outputs = [status, project_state, summary, runs, existing]
    tab = ProjectsTab(studio, outputs)
    create.click(tab.on_create, name, outputs)
    name.submit(tab.on_open, name, outputs)
    open_button.click(tab.on_open, name, outputs)
    existing.input(tab.on_open, existing, outputs)
    return tab
