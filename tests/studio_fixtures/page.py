"""The studio's tabs built as the page builds them, without a browser: their handlers are the real ones.

Backend tests call the handlers a button would call (``tabs.tools.on_connect(path, text)``, ...)
with the values a person would type; tests/test_studio_browser.py drives the same page in Chromium.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the page needs gradio (the studio extra): imported when a test builds it
    from rlf_studio.ui.common import Studio
    from rlf_studio.ui.tab_data import DataTab
    from rlf_studio.ui.tab_playground import PlaygroundTab
    from rlf_studio.ui.tab_projects import ProjectsTab
    from rlf_studio.ui.tab_tools import ToolsTab
    from rlf_studio.ui.tab_train import TrainTab


@dataclass
class Tabs:
    projects: ProjectsTab
    tools: ToolsTab
    data: DataTab
    playground: PlaygroundTab
    train: TrainTab


def page_tabs(studio: Studio) -> Tabs:
    """The tabs of one page over ``studio`` (close it with ``studio.close()``: it holds the servers and runs)."""
    import gradio as gr

    from rlf_studio.ui import tab_data, tab_playground, tab_projects, tab_tools, tab_train

    with gr.Blocks():
        project_state = gr.State("")
        return Tabs(
            projects=tab_projects.build(studio, project_state),
            tools=tab_tools.build(studio, project_state),
            data=tab_data.build(studio, project_state),
            playground=tab_playground.build(studio, project_state),
            train=tab_train.build(studio, project_state),
        )
