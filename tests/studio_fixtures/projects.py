"""The small project the studio's backend tests start from: two echo tasks and the bundled latency server."""

from __future__ import annotations

from pathlib import Path

from rlf_studio.data import map_records, save_tasks
from rlf_studio.project import Project, create_project
from rlf_studio.tools import add_bundled

TASKS = [
    {"question": "Echo the word ping.", "answer": "ping"},
    {"question": "Echo the word pong.", "answer": "pong"},
]


def echo_project(root: Path, name: str = "p") -> Project:
    """A project under ``root`` with :data:`TASKS` as its train tasks and the latency server in mcp.json."""
    project = create_project(root, name)
    save_tasks(project, map_records(TASKS, "question", "answer"), [], {"file": "inline"})
    project.write_json(project.mcp_path, add_bundled("{}", "latency")[0])
    return project
