"""A studio project: one folder holding everything a run needs, readable without the studio.

Layout (every file is optional until the tab that writes it has been used)::

    <project>/
      project.json         {"name": ..., "created": ...}: marks the folder as a project
      mcp.json             the Claude-Desktop ``mcpServers`` JSON of the Tools tab
      tasks/train.jsonl    {"id", "question", "answer"} per line (Data tab)
      tasks/test.jsonl
      tasks/source.json    where the tasks came from and how the fields were mapped
      reward.json          the Reward tab's choice (built-ins, weights, judge, python file)
      configs/<run>.yaml   trainer configs (Train tab)
      runs/<run>/          what ``rlf-train`` writes (metrics.jsonl, train_samples.jsonl, ...)

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> project = create_project(root, "demo")
    >>> [p.name for p in list_projects(root)], project.has_tasks, is_project(root, "demo")
    (['demo'], False, True)
    >>> create_project(root, "../bad")
    Traceback (most recent call last):
    ...
    rlf_studio.project.ProjectError: a project name may hold letters, digits, '-', '_' and '.' (no spaces or '/'), got '../bad'
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MARKER = "project.json"


class ProjectError(ValueError):
    """A project cannot be created or opened (bad name, not a project folder, ...)."""


@dataclass(frozen=True)
class Project:
    """Paths of one project folder."""

    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def mcp_path(self) -> Path:
        return self.root / "mcp.json"

    @property
    def tasks_dir(self) -> Path:
        return self.root / "tasks"

    @property
    def train_tasks(self) -> Path:
        return self.tasks_dir / "train.jsonl"

    @property
    def test_tasks(self) -> Path:
        return self.tasks_dir / "test.jsonl"

    @property
    def reward_path(self) -> Path:
        return self.root / "reward.json"

    @property
    def configs_dir(self) -> Path:
        return self.root / "configs"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def has_tasks(self) -> bool:
        return self.train_tasks.is_file()

    def read_json(self, path: Path, default: Any = None) -> Any:
        """A JSON file of the project, or ``default`` when it does not exist yet."""
        if not path.is_file():
            return default
        return json.loads(path.read_text(encoding="utf-8"))

    def write_text(self, path: Path, text: str) -> Path:
        """Write atomically (a temp file then a rename), so a crash never leaves half a file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        return path

    def write_json(self, path: Path, data: Any) -> Path:
        return self.write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")

    def runs(self) -> list[str]:
        """Run folders (those with a metrics file or a config), newest first."""
        if not self.runs_dir.is_dir():
            return []
        runs = [p for p in self.runs_dir.iterdir() if p.is_dir()]
        runs.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        return [p.name for p in runs]

    def configs(self) -> list[str]:
        """Saved train configs (file stems), sorted."""
        if not self.configs_dir.is_dir():
            return []
        return sorted(p.stem for p in self.configs_dir.glob("*.yaml"))

    def summary(self) -> str:
        """A one-paragraph Markdown summary of what the project holds."""
        servers = len((self.read_json(self.mcp_path, {}) or {}).get("mcpServers", {}))
        lines = sum(1 for _ in self.train_tasks.open(encoding="utf-8")) if self.has_tasks else 0
        reward = (self.read_json(self.reward_path, {}) or {}).get("components", [])
        names = ", ".join(str(c.get("name")) for c in reward) or "none yet"
        return (
            f"**{self.name}** at `{self.root}`: {servers} MCP server(s), {lines} train task(s), "
            f"reward: {names}, {len(self.configs())} config(s), {len(self.runs())} run(s)."
        )


def check_name(name: str, what: str = "project") -> str:
    """A valid project (or run, config: ``what``) name: letters, digits, ``-_.``; else :class:`ProjectError`.

    Example:
        >>> check_name("my run", "run")
        Traceback (most recent call last):
        ...
        rlf_studio.project.ProjectError: a run name may hold letters, digits, '-', '_' and '.' (no spaces or '/'), got 'my run'
    """
    name = (name or "").strip()
    if not _NAME.match(name):
        raise ProjectError(
            f"a {what} name may hold letters, digits, '-', '_' and '.' (no spaces or '/'), got {name!r}"
        )
    return name


def is_project(root: Path, name: str) -> bool:
    """Whether ``root/name`` is a project already (``name`` checked: :class:`ProjectError` when invalid)."""
    return (Path(root) / check_name(name) / MARKER).is_file()


def create_project(root: Path, name: str) -> Project:
    """Create ``root/name`` (or reuse it when it is already a project)."""
    folder = Path(root) / check_name(name)
    project = Project(folder)
    if not (folder / MARKER).is_file():
        if folder.exists() and any(folder.iterdir()):
            raise ProjectError(f"{folder} exists and is not an RLF Studio project (no {MARKER})")
        project.write_json(
            folder / MARKER, {"name": folder.name, "created": time.strftime("%Y-%m-%d %H:%M:%S")}
        )
    for sub in (project.tasks_dir, project.configs_dir, project.runs_dir):
        sub.mkdir(parents=True, exist_ok=True)
    return project


def open_project(root: Path, name_or_path: str) -> Project:
    """A project by name under ``root`` or by folder path; :class:`ProjectError` when it is none."""
    text = (name_or_path or "").strip()
    if not text:
        raise ProjectError("type a project name or pick one from the list")
    folder = (
        Path(text).expanduser() if ("/" in text or text.startswith("~")) else Path(root) / check_name(text)
    )
    if not (folder / MARKER).is_file():
        raise ProjectError(f"{folder} is not an RLF Studio project (no {MARKER}); create it first")
    return Project(folder.resolve())


def list_projects(root: Path) -> list[Project]:
    """Projects directly under ``root``, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return [Project(p) for p in sorted(root.iterdir()) if (p / MARKER).is_file()]
