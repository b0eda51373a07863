"""What every tab shares: the :class:`Studio` (server-side sessions), messages, and guarded handlers.

A handler that raises never breaks the page: :func:`guarded` turns the exception into a red
message in the tab's status box and leaves every other output as it was.

Example:
    >>> ok("saved"), error("no <tasks>")
    ('**Done:** saved', '**Error:** no &lt;tasks&gt;')
"""

from __future__ import annotations

import functools
import html
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr

from rlf_studio.playground import EpisodeSession
from rlf_studio.project import Project, ProjectError
from rlf_studio.runner import RunProcess
from rlf_studio.tools import ToolSession

logger = logging.getLogger("rlf_studio")


def ok(message: str) -> str:
    return f"**Done:** {message}"


def stopped(message: str) -> str:
    """A run the person stopped: neither done nor an error."""
    return f"**Stopped:** {html.escape(message)}"


def error(message: str) -> str:
    return f"**Error:** {html.escape(message)}"


class Studio:
    """The app's server-side state: projects root and the live sessions, keyed by project folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.tool_sessions: dict[str, ToolSession] = {}
        self.episodes: dict[str, EpisodeSession] = {}
        self.runs: dict[str, RunProcess] = {}
        self.servers: dict[str, RunProcess] = {}  # rlf-serve processes of trained models, by run folder
        # the longest tool result seen per project (Tools tab calls, Playground episodes): Start's
        # token budget makes room for results this long
        self.tool_results: dict[str, str] = {}

    def project(self, path: str | None) -> Project:
        if not path:
            raise ProjectError("open or create a project first (Projects tab)")
        return Project(Path(path))

    def saw_tool_result(self, path: str, text: str) -> None:
        """Keep ``text`` when it is the longest tool result seen in project ``path`` so far."""
        key = str(self.project(path).root)
        if len(text) > len(self.tool_results.get(key, "")):
            self.tool_results[key] = text

    def longest_tool_result(self, path: str) -> str | None:
        """The longest tool result seen in project ``path`` (None: no tool was called yet)."""
        return self.tool_results.get(str(self.project(path).root))

    def replace_tools(self, key: str, session: ToolSession | None) -> None:
        old = self.tool_sessions.pop(key, None)
        if old is not None:
            old.close()
        if session is not None:
            self.tool_sessions[key] = session

    def replace_episode(self, key: str, session: EpisodeSession | None) -> None:
        old = self.episodes.pop(key, None)
        if old is not None:
            old.close()
        if session is not None:
            self.episodes[key] = session

    def close(self) -> None:
        for key in list(self.tool_sessions):
            self.replace_tools(key, None)
        for key in list(self.episodes):
            self.replace_episode(key, None)
        for run in [*self.runs.values(), *self.servers.values()]:
            run.abort()


def guarded(n_outputs: int, status_index: int = 0) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a handler with ``n_outputs`` outputs: an exception becomes an error in output ``status_index``."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            try:
                return fn(*args)
            except Exception as exc:
                logger.info("handler %s failed", fn.__name__, exc_info=True)
                outputs: list[Any] = [gr.skip()] * n_outputs
                outputs[status_index] = error(str(exc) or type(exc).__name__)
                return outputs[0] if n_outputs == 1 else tuple(outputs)

        return wrapper

    return decorate


def status_box(elem_id: str) -> gr.Markdown:
    return gr.Markdown("", elem_id=elem_id, elem_classes=["rlf-status"])
