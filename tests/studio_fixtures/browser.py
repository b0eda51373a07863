"""Helpers for the studio's browser tests: start the studio, find Chromium, drive Gradio widgets.

Widgets are found by their ``elem_id`` (``#project-name``, ``#mcp-json``, ...); a Gradio textbox
is a ``textarea`` or ``input`` inside that element, a dropdown an ``input`` whose options appear
in a list once it is clicked.

Screenshots go to a temporary folder, so running the tests never changes the tracked files;
``RLF_STUDIO_SCREENSHOTS=docs/studio python -m pytest tests/test_studio_browser.py`` refreshes
the docs' screenshots (docs/studio.md).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, free_local_port, wait_for_port

SCREENSHOTS_ENV = "RLF_STUDIO_SCREENSHOTS"  # a folder (relative: to the repository) to write them into
FIXTURES = REPO / "tests" / "studio_fixtures"
STEP_TIMEOUT_MS = 30_000  # a Gradio round trip on a busy 2-core machine
TRAIN_TIMEOUT_MS = 240_000  # a tiny-model run: interpreter, torch, model, 2 GRPO steps


def screenshot_dir(default: Path) -> Path:
    """``$RLF_STUDIO_SCREENSHOTS`` (e.g. docs/studio), else ``default`` (a test's temporary folder)."""
    target = os.environ.get(SCREENSHOTS_ENV, "").strip()
    if not target:
        return default
    path = Path(target)
    return path if path.is_absolute() else REPO / path


def chromium_path() -> str:
    """Debian's Chromium (scripts/_system_deps.sh installs it), or skip with the reason."""
    candidates = [os.environ.get("RLF_CHROMIUM", ""), "/usr/bin/chromium", "/usr/bin/chromium-browser"]
    for candidate in [*candidates, shutil.which("chromium") or ""]:
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("no Chromium: apt-get install chromium (scripts/_system_deps.sh does) or set RLF_CHROMIUM")


@contextlib.contextmanager
def studio_server(project_dir: Path) -> Iterator[str]:
    """``python -m rlf_studio`` on a free port of 127.0.0.1, as a user starts it; yields its URL."""
    port = free_local_port()
    log = (project_dir.parent / "studio-server.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRADIO_ANALYTICS_ENABLED": "False"}
    argv = [sys.executable, "-m", "rlf_studio", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [*argv, "--project-dir", str(project_dir)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for_port(port, process, 120)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


class Page:
    """A Playwright page with the few gestures the studio needs."""

    def __init__(self, page: Any, shots: Path) -> None:
        from playwright.sync_api import expect

        self.page = page
        self.expect = expect
        self.shots = shots
        self.console: list[str] = []  # the browser console's warnings and errors, as "type: text"
        page.on("console", self._console)

    def _console(self, message: Any) -> None:
        if message.type in ("warning", "error"):
            self.console.append(f"{message.type}: {message.text}")

    def open(self, url: str, tries: int = 3) -> None:
        """Go to the studio at ``url`` and check that the page answers a button before a test uses it.

        On a busy machine the first events of a fresh page sometimes never come back (their
        queue/join requests stay unanswered until the page goes; at 121cc14 too, 1 fresh page in 30
        here), and the first test then waits on an answer that never comes: such a page is loaded
        again.
        """
        for _ in range(tries):
            self.page.goto(url)
            self.fill("project-name", "")
            self.click("project-open")  # an empty name: the tab answers at once, and opens nothing
            try:
                self.sees("project-status", "type a project name", timeout_ms=STEP_TIMEOUT_MS // 2)
                return
            except AssertionError:
                continue
        raise AssertionError(f"the studio at {url} answered no button in {tries} page loads")

    def reload(self) -> None:
        """Reload the page, as a person pressing F5, and wait until the app is back."""
        self.page.reload()
        self.page.get_by_role("tab", name="Projects", exact=True).wait_for(timeout=STEP_TIMEOUT_MS)

    def stored(self, key: str) -> str | None:
        """The browser's local-storage entry ``key`` (the studio keeps the open project and form there)."""
        return self.page.evaluate("key => localStorage.getItem(key)", key)

    def wait_stored(self, key: str, old: str | None) -> None:
        """Until local storage's ``key`` differs from ``old`` (each save re-encrypts, so any save does)."""
        self.page.wait_for_function("([key, old]) => localStorage.getItem(key) !== old", arg=[key, old],
                                    timeout=STEP_TIMEOUT_MS)  # fmt: skip

    def options(self, elem_id: str) -> list[str]:
        """The options a dropdown offers (it is opened, read and closed)."""
        self.page.locator(f"#{elem_id} input").first.click()
        options = self.page.get_by_role("option")
        options.first.wait_for(timeout=STEP_TIMEOUT_MS)
        names = [text.strip().splitlines()[-1].strip() for text in options.all_inner_texts()]  # minus a tick
        self.page.keyboard.press("Escape")
        return names

    def visible(self, elem_id: str) -> bool:
        return self.page.locator(f"#{elem_id}").is_visible()

    def lacks(self, elem_id: str, text: str, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
        self.expect(self.page.locator(f"#{elem_id}")).not_to_contain_text(text, timeout=timeout_ms)

    def tab(self, name: str) -> None:
        self.page.get_by_role("tab", name=name, exact=True).click()

    def fill(self, elem_id: str, text: str) -> None:
        self.page.locator(f"#{elem_id} textarea, #{elem_id} input").first.fill(str(text))

    def click(self, elem_id: str) -> None:
        self.page.locator(f"#{elem_id}").click()

    def pick(self, elem_id: str, option: str) -> None:
        """Choose ``option`` in a dropdown."""
        box = self.page.locator(f"#{elem_id} input").first
        box.click()
        self.page.get_by_role("option", name=option, exact=True).click()

    def check(self, elem_id: str, label: str) -> None:
        """Tick (or untick) the checkbox or radio labelled ``label`` inside a group."""
        self.page.locator(f"#{elem_id}").get_by_text(label, exact=True).click()

    def upload(self, elem_id: str, path: Path) -> None:
        self.page.locator(f"#{elem_id} input[type=file]").set_input_files(str(path))

    def text(self, elem_id: str) -> str:
        return self.page.locator(f"#{elem_id}").inner_text()

    def value(self, elem_id: str) -> str:
        return self.page.locator(f"#{elem_id} textarea, #{elem_id} input").first.input_value()

    def sees(self, elem_id: str, text: str, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
        self.expect(self.page.locator(f"#{elem_id}")).to_contain_text(text, timeout=timeout_ms)

    def has_value(self, elem_id: str, text: str, timeout_ms: int = STEP_TIMEOUT_MS) -> None:
        import re

        box = self.page.locator(f"#{elem_id} textarea, #{elem_id} input").first
        self.expect(box).to_have_value(re.compile(".*" + re.escape(text) + ".*", re.S), timeout=timeout_ms)

    def screenshot(self, name: str) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        # the last update painted: two animation frames have gone by since it was applied
        self.page.evaluate(
            "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"
        )
        self.page.screenshot(path=str(path), full_page=True)
        return path
