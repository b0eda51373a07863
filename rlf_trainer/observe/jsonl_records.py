"""One JSONL line as a record, or None for a line that is blank, torn or not an object.

The trainer appends its logs (``metrics.jsonl``, ``train_samples.jsonl``) a line at a time, so a
reader may meet a line being written, or one cut short when the process died. No torch here: the
studio reads runs with it.

Example:
    >>> parse_record('{"step": 1}'), parse_record('{"step": 2, "tra'), parse_record("[1]")
    ({'step': 1}, None, None)
"""

from __future__ import annotations

import json
from typing import Any


def parse_record(line: str) -> dict[str, Any] | None:
    """The line's JSON object; None for a blank or torn line, or a value that is not an object."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


__all__ = ["parse_record"]
