"""Execution match: do two queries' result sets agree? Multisets of rows, ordered only when asked.

Column order matters (rows are compared as tuples), column names do not (aliases are free).
Floats are rounded so that ``AVG(x)`` and ``SUM(x) * 1.0 / COUNT(x)`` agree, and ``5`` equals ``5.0``.

Example:
    >>> results_match([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], ordered=False)
    True
    >>> results_match([(1, "a"), (2, "b")], [(2, "b"), (1, "a")], ordered=True)
    False
    >>> results_match([("a", 1)], [(1, "a")], ordered=False)   # reordered columns differ
    False
    >>> has_top_level_order_by("SELECT * FROM (SELECT x FROM t ORDER BY x LIMIT 3)")
    False
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

FLOAT_DECIMALS = 4

# string literals, quoted identifiers and comments: their contents are not SQL keywords
_QUOTED_OR_COMMENT = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?\*/", re.DOTALL
)
_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def has_top_level_order_by(sql: str) -> bool:
    """Whether the outermost SELECT of ``sql`` has ``ORDER BY`` (not one inside a subquery).

    Example:
        >>> has_top_level_order_by("SELECT name FROM t WHERE note = 'order by' ORDER BY name")
        True
    """
    code = _QUOTED_OR_COMMENT.sub(" ", sql)
    depth = 0
    top_level: list[str] = []
    for char in code:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif depth == 0:
            top_level.append(char)
            continue
        top_level.append(" ")  # keep words on either side of a subquery apart
    return _ORDER_BY.search("".join(top_level)) is not None


def normalize_value(value: Any, decimals: int = FLOAT_DECIMALS) -> Any:
    """A value in the form results are compared in: floats rounded, integral floats as ints.

    Example:
        >>> normalize_value(2.0), normalize_value(1 / 3), normalize_value("x")
        (2, 0.3333, 'x')
    """
    if isinstance(value, float):
        rounded = round(value, decimals)
        return int(rounded) if rounded.is_integer() else rounded
    return value


def normalize_rows(rows: Sequence[Sequence[Any]], decimals: int = FLOAT_DECIMALS) -> list[tuple[Any, ...]]:
    """Every row as a tuple of normalised values."""
    return [tuple(normalize_value(v, decimals) for v in row) for row in rows]


def results_match(
    gold: Sequence[Sequence[Any]],
    pred: Sequence[Sequence[Any]],
    *,
    ordered: bool,
    decimals: int = FLOAT_DECIMALS,
) -> bool:
    """Whether ``pred`` has the same rows as ``gold``: as sequences if ``ordered``, else as multisets."""
    if len(gold) != len(pred):
        return False
    gold_rows, pred_rows = normalize_rows(gold, decimals), normalize_rows(pred, decimals)
    if ordered:
        return gold_rows == pred_rows
    return Counter(gold_rows) == Counter(pred_rows)
