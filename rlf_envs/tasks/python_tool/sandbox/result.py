"""What one sandboxed run produced, and the text a model reads about it.

Example:
    >>> result = SandboxResult(stdout="18272727\\n", stderr="", exit_code=0, outcome=Outcome.EXITED)
    >>> print(result.to_text())
    18272727
    [exit code 0]
"""

from __future__ import annotations

import enum
import signal
from dataclasses import asdict, dataclass
from typing import Any


class Outcome(enum.StrEnum):
    """How the child process ended."""

    EXITED = "exited"  # it exited by itself (any exit code)
    CPU_LIMIT = "cpu_limit"  # RLIMIT_CPU: SIGXCPU (or SIGKILL at the hard limit)
    WALL_TIMEOUT = "wall_timeout"  # the server killed the process group after wall_s
    OUTPUT_LIMIT = "output_limit"  # the server killed the process group past output_chars
    SIGNALLED = "signalled"  # another signal ended it (e.g. SIGSEGV)


@dataclass(frozen=True)
class SandboxResult:
    """The captured output (already capped) and how the process ended.

    ``exit_code`` is the process's return code: >= 0 for an exit, ``-N`` for death by signal N.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    outcome: Outcome
    output_truncated: bool = False
    duration_s: float = 0.0
    cpu_limit_s: float = 0.0
    wall_limit_s: float = 0.0
    output_limit_chars: int = 0

    @property
    def ok(self) -> bool:
        """Whether the program ran to completion with exit code 0."""
        return self.outcome is Outcome.EXITED and self.exit_code == 0

    def status_line(self) -> str:
        """``[exit code N]`` or why the process was killed."""
        if self.outcome is Outcome.EXITED:
            return f"[exit code {self.exit_code}]"
        if self.outcome is Outcome.CPU_LIMIT:
            return f"[killed: CPU time limit of {self.cpu_limit_s:g} s exceeded]"
        if self.outcome is Outcome.WALL_TIMEOUT:
            return f"[killed: wall-clock limit of {self.wall_limit_s:g} s exceeded]"
        if self.outcome is Outcome.OUTPUT_LIMIT:
            return f"[killed: output exceeded {self.output_limit_chars} characters; the rest was discarded]"
        return f"[killed by signal {_signal_name(self.exit_code)}]"

    def to_text(self) -> str:
        """The model-facing text: stdout, then ``[stderr]`` and stderr if any, then the status line."""
        parts: list[str] = []
        if self.stdout:
            parts.append(_with_newline(self.stdout))
        if self.stderr:
            parts.append("[stderr]\n" + _with_newline(self.stderr))
        if not parts:
            hint = " (print() the values you want to see)" if self.ok else ""
            parts.append(f"[no output]{hint}\n")
        return "".join(parts) + self.status_line()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict (the tool's structured content)."""
        record = asdict(self)
        record["outcome"] = self.outcome.value
        record["ok"] = self.ok
        record["duration_s"] = round(self.duration_s, 6)
        return record


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def _signal_name(exit_code: int | None) -> str:
    if exit_code is None or exit_code >= 0:
        return str(exit_code)
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return str(-exit_code)
