"""What the studio says about a run's health and pace: tripped checks, elapsed time and ETA.

The trainer's health checks (:mod:`rlf_trainer.observe.health`, docs/trainer.md) append one JSON line per
tripped check to ``<run dir>/health.jsonl``: a :class:`~rlf_trainer.observe.health.Trip`, ``{"step",
"check", "message", "hint"}``. A run without that file (an older trainer, or a healthy run) has
tripped nothing.

Example:
    >>> import json, tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> tripped_checks(run)
    []
    >>> line = {"step": 3, "check": "no_learning_signal", "message": "90% of groups had one reward",
    ...         "hint": "raise algorithm.group_size"}
    >>> _ = (run / "health.jsonl").write_text(json.dumps(line) + "\\n" + "{half a line")
    >>> health_words(tripped_checks(run))
    'no_learning_signal (step 3): 90% of groups had one reward. Try: raise algorithm.group_size'
    >>> pace_words(elapsed_s=120.0, done=2, total=6)
    'elapsed 2m 00s, ETA 4m 00s'
"""

from __future__ import annotations

import json
from pathlib import Path

from rlf_trainer.observe.health import HEALTH_FILE, Trip


def trip_words(trip: Trip) -> str:
    """``check (step N): message. Try: hint``."""
    hint = f" Try: {trip.hint}" if trip.hint else ""
    return f"{trip.check} (step {trip.step}): {trip.message.rstrip('.')}.{hint}"


def tripped_checks(run_dir: Path) -> list[Trip]:
    """The run's tripped checks, one per check name (its first trip), in step order.

    Missing file, half-written or malformed lines are skipped: a run being written is read often.
    """
    path = Path(run_dir) / HEALTH_FILE
    if not path.is_file():
        return []
    first: dict[str, Trip] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or not row.get("check"):
            continue
        try:
            step = int(row.get("step") or 0)
        except (TypeError, ValueError):
            step = 0
        name = str(row["check"])
        if name not in first:
            first[name] = Trip(step, name, str(row.get("message") or ""), str(row.get("hint") or ""))
    return sorted(first.values(), key=lambda c: c.step)


def health_words(checks: list[Trip]) -> str:
    """The tripped checks as one line of plain words ('' when none tripped)."""
    return "; ".join(trip_words(check) for check in checks)


def duration_words(seconds: float) -> str:
    """``1h 02m``, ``3m 07s`` or ``42s``.

    Example:
        >>> duration_words(3725), duration_words(187), duration_words(4.4)
        ('1h 02m', '3m 07s', '4s')
    """
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def pace_words(elapsed_s: float, done: int, total: int) -> str:
    """Elapsed time and, once a step is done, the time the remaining steps should take at this pace."""
    text = f"elapsed {duration_words(elapsed_s)}"
    if done <= 0 or total <= done:
        return text + (", ETA: after the first step" if done <= 0 and total > 0 else "")
    return text + f", ETA {duration_words(elapsed_s / done * (total - done))}"
