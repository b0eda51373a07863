"""The Data tab's backend: read a task file, map its fields to question/answer, split, save.

Reads JSONL, JSON (a list, or ``{"tasks": [...]}`` / ``{"data": [...]}``) and parquet (with
pyarrow), including Search-R1 style rows (``question`` + ``golden_answers``). The saved files are
what ``RLF/ToolUse-v0`` reads: one ``{"id", "question", "answer"}`` object per line.

Example:
    >>> rows = [{"q": "1+1?", "golden_answers": ["2", "two"]}, {"q": "2+2?", "golden_answers": ["4"]}]
    >>> guess_mapping(columns(rows))
    ('', 'golden_answers')
    >>> map_records(rows, "q", "golden_answers")[0]
    {'id': '0', 'question': '1+1?', 'answer': ['2', 'two']}
    >>> guess_id_column(["qid", "q"]), map_records([{"qid": "a7", "q": "x?", "a": 1}], "q", "a", "qid")[0]["id"]
    ('qid', 'a7')
    >>> map_records(rows, "question", "golden_answers")
    Traceback (most recent call last):
    ...
    rlf_studio.data.DataError: no column 'question' in the file; its columns are: golden_answers, q
    >>> [len(part) for part in split_records(list(range(10)), 0.2, seed=0)]
    [8, 2]
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlf_studio.project import Project

QUESTION_NAMES = ("question", "prompt", "query", "problem", "input")
ANSWER_NAMES = ("answer", "golden_answers", "answers", "solution", "target", "output")
ID_NAMES = ("id", "_id", "qid", "question_id", "task_id", "uid", "idx", "index")
MAX_ROWS = 200_000
TASK_FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


class DataError(ValueError):
    """The task file cannot be read or mapped (bad format, missing column, wrong types)."""


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSONL / JSON / parquet file as dicts; :class:`DataError` names the problem."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in TASK_FILE_SUFFIXES:
        raise DataError(f"{path.name} is not a task file: use {', '.join(TASK_FILE_SUFFIXES)}")
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:  # pragma: no cover - depends on the install
            raise DataError("reading parquet needs pyarrow: pip install 'rlf[data]'") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:
            raise DataError(f"cannot read {path.name} as parquet: {exc}") from None
    elif suffix == ".json":
        rows = _json_rows(path)
    else:
        rows = _jsonl_rows(path)
    if not rows:
        raise DataError(f"{path.name} holds no rows")
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        raise DataError(f"row {bad + 1} of {path.name} is not an object")
    return rows[:MAX_ROWS]


def _jsonl_rows(path: Path) -> list[Any]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise DataError(f"line {number} of {path.name} is not valid JSON: {exc.msg}") from None
    return rows


def _json_rows(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path.name} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    if isinstance(data, dict):
        data = next((data[k] for k in ("tasks", "data", "rows") if isinstance(data.get(k), list)), None)
    if not isinstance(data, list):
        raise DataError(f"{path.name} must hold a list of rows (or {{'tasks': [...]}})")
    return data


def columns(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Every key that appears in the first 100 rows, sorted."""
    return sorted({key for row in rows[:100] for key in row})


def guess_mapping(cols: Sequence[str]) -> tuple[str, str]:
    """The likely (question column, answer column); '' where no known name is present."""
    question = next((name for name in QUESTION_NAMES if name in cols), "")
    answer = next((name for name in ANSWER_NAMES if name in cols), "")
    return question, answer


def guess_id_column(cols: Sequence[str]) -> str:
    """The likely id column ('' when none: the tasks are then numbered by row)."""
    return next((name for name in ID_NAMES if name in cols), "")


def _task_ids(rows: Sequence[dict[str, Any]], id_column: str) -> list[str]:
    """Each row's task id: the ``id_column`` value, or the row number when no column is given."""
    if not id_column:
        return [str(index) for index in range(len(rows))]
    ids, seen = [], {}
    for index, row in enumerate(rows):
        value = row.get(id_column)
        if value is None or str(value).strip() == "":
            raise DataError(f"row {index + 1}: the id column {id_column!r} is empty")
        text = str(value)
        if text in seen:
            raise DataError(
                f"rows {seen[text] + 1} and {index + 1} share the id {text!r}: ids must be unique "
                "(pick another id column, or none to number the rows)"
            )
        seen[text] = index
        ids.append(text)
    return ids


def _answer(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    if hasattr(value, "tolist"):
        return [str(v) for v in value.tolist()]
    return str(value)


def map_records(
    rows: Sequence[dict[str, Any]], question: str, answer: str, id_column: str = ""
) -> list[dict[str, Any]]:
    """Rows as ``{"id", "question", "answer"}`` tasks; :class:`DataError` for a missing or bad column.

    The ids come from ``id_column`` (unique, non-empty) or, without one, from the row numbers.
    """
    cols = columns(rows)
    for role, name in (("question", question), ("answer", answer)):
        if not name:
            raise DataError(f"pick the {role} column; the file's columns are: {', '.join(cols)}")
        if name not in cols:
            raise DataError(f"no column {name!r} in the file; its columns are: {', '.join(cols)}")
    if id_column and id_column not in cols:
        raise DataError(f"no id column {id_column!r} in the file; its columns are: {', '.join(cols)}")
    ids = _task_ids(rows, id_column)
    tasks = []
    for index, row in enumerate(rows):
        text = row.get(question)
        if not isinstance(text, str) or not text.strip():
            raise DataError(
                f"row {index + 1}: the question column {question!r} must be non-empty text, got {text!r}"
            )
        tasks.append({"id": ids[index], "question": text, "answer": _answer(row.get(answer))})
    return tasks


def split_records(records: list[Any], test_fraction: float, seed: int = 0) -> tuple[list[Any], list[Any]]:
    """(train, test) after a seeded shuffle; a non-empty list keeps at least one train row."""
    if not 0 <= test_fraction < 1:
        raise DataError(f"the test fraction must be in [0, 1), got {test_fraction}")
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    n_test = min(int(round(len(shuffled) * test_fraction)), max(len(shuffled) - 1, 0))
    return shuffled[n_test:], shuffled[:n_test]


def save_tasks(
    project: Project, train: list[dict[str, Any]], test: list[dict[str, Any]], source: dict[str, Any]
) -> str:
    """Write tasks/train.jsonl, tasks/test.jsonl (when non-empty) and tasks/source.json."""

    def jsonl(rows: list[dict[str, Any]]) -> str:
        return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)

    project.write_text(project.train_tasks, jsonl(train))
    if test:
        project.write_text(project.test_tasks, jsonl(test))
    elif project.test_tasks.exists():
        project.test_tasks.unlink()
    project.write_json(project.tasks_dir / "source.json", source)
    return f"saved {len(train)} train and {len(test)} test task(s) into {project.tasks_dir}"


def load_tasks(project: Project, split: str = "train") -> list[dict[str, Any]]:
    """The project's saved tasks of a split ([] when there are none)."""
    path = project.train_tasks if split == "train" else project.test_tasks
    return _jsonl_rows(path) if path.is_file() else []


def preview_rows(rows: Sequence[dict[str, Any]], limit: int = 10) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the first ``limit`` rows, values as short strings, for a table.

    Example:
        >>> preview_rows([{"q": "x" * 300, "a": [1]}])[1][0][0][-3:]
        '...'
    """
    cols = list(dict.fromkeys(key for row in rows[:100] for key in row))  # first-seen order

    def cell(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        return text if len(text) <= 200 else text[:197] + "..."

    return cols, [[cell(row.get(c)) for c in cols] for row in rows[:limit]]
