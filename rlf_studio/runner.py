"""A training run as a subprocess: start, watch, abort (cleanly), resume.

The process runs in its own session (process group), so Abort reaches its MCP servers too:
SIGTERM to the whole group, then SIGKILL after a short grace. SIGINT is never relied on: a studio
started as ``rlf-studio &`` from a script has SIGINT ignored, its children inherit that, and a
SIGINT-based abort then waited out its whole grace while the trainer went on logging steps. Its
output goes to ``<run dir>/studio.log``; the state a page shows is :meth:`RunProcess.status`,
worded for people by :func:`state_label`.

Example:
    >>> import sys, tempfile
    >>> run = RunProcess.start([sys.executable, "-c", "print('hi')"], Path(tempfile.mkdtemp()), {})
    >>> run.wait(30), run.status(), run.log_tail().splitlines()[-1]
    (0, 'finished', 'hi')
    >>> run.claim_end_message(), run.claim_end_message()
    (True, False)
    >>> run.abort(), state_label("aborted"), state_label("failed (exit 1)")
    ('finished', 'Aborted', 'Error')
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

LOG_NAME = "studio.log"
ABORT_GRACE_S = 3.0  # SIGTERM -> SIGKILL: the trainer keeps nothing it would save in that time


def state_label(state: str) -> str:
    """The one word every view uses for a run state: Running, Done, Aborted or Error."""
    if state == "running":
        return "Running"
    if state == "finished":
        return "Done"
    if state == "aborted":
        return "Aborted"
    return "Error"


class RunProcess:
    """One started run."""

    def __init__(
        self, process: subprocess.Popen[bytes], run_dir: Path, command: list[str], log_name: str = LOG_NAME
    ) -> None:
        self.process = process
        self.run_dir = run_dir
        self.command = command
        self.log_name = log_name
        self.aborted = False
        self.started_at = time.time()
        self._ended_at: float | None = None
        self._end_told = False
        self._lock = threading.Lock()

    @classmethod
    def start(
        cls,
        command: list[str],
        run_dir: Path,
        env: dict[str, str],
        cwd: Path | None = None,
        log_name: str = LOG_NAME,
    ) -> RunProcess:
        run_dir.mkdir(parents=True, exist_ok=True)
        log = (run_dir / log_name).open("ab")
        log.write(f"$ {' '.join(command)}\n".encode())
        log.flush()
        try:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=cwd or run_dir, env=env or None, start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        return cls(process, run_dir, command, log_name)

    @property
    def running(self) -> bool:
        if self.process.poll() is None:
            return True
        if self._ended_at is None:
            self._ended_at = time.time()  # first seen ended: exact enough for a page that polls
        return False

    def ended_at(self) -> float:
        """When the run was first seen ended (now, while it runs)."""
        return self._ended_at if not self.running and self._ended_at is not None else time.time()

    def status(self) -> str:
        """``running``, ``finished``, ``aborted`` or ``failed (exit N)``."""
        if self.running:
            return "running"
        code = self.process.returncode
        if self.aborted:
            return "aborted"
        return "finished" if code == 0 else f"failed (exit {code})"

    def claim_end_message(self) -> bool:
        """True for the first caller after the run has ended, False before and after that.

        A page that polls says the end once: a late poll never writes it again over a newer message.
        """
        with self._lock:
            if self._end_told or self.running:
                return False
            self._end_told = True
            return True

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def abort(self, grace_s: float = ABORT_GRACE_S) -> str:
        """Stop the run's whole process group (SIGTERM, SIGKILL after ``grace_s``); returns the status after.

        Aborting a run that already ended changes nothing and returns its status. The caller of an
        abort that stopped the run says its end: :meth:`claim_end_message` answers False after it.
        """
        with self._lock:
            if not self.running:
                return self.status()
            self.aborted = True
            self._end_told = True
            for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, sig)
                try:
                    self.process.wait(wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)  # servers the trainer left behind
        return self.status()

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.run_dir, lines, self.log_name)


def log_tail(run_dir: Path, lines: int = 40, log_name: str = LOG_NAME) -> str:
    """The end of a run's studio log (also for runs started by an earlier studio)."""
    path = run_dir / log_name
    if not path.is_file():
        return ""
    text = path.read_bytes()[-64_000:].decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])
