"""Read-only, time-limited execution of one model-written SELECT against a sqlite file.

Several independent locks keep the database unchanged whatever the model writes:

1. the text must be a single ``SELECT`` / ``WITH`` statement (checked with
   :func:`sqlite3.complete_statement` before sqlite sees it);
2. the file is opened through a ``file:...?mode=ro`` URI, so sqlite cannot write it;
3. ``PRAGMA query_only=ON`` refuses any write even to temp tables;
4. an authorizer callback allows only reads, SELECTs, recursive CTEs and plain functions: it
   denies writes, ``ATTACH``, every ``PRAGMA`` and ``load_extension``;
5. a progress handler aborts the statement once its deadline has passed (a recursive CTE that
   never ends, a huge cross join), and string/blob values are capped in size.

Every failure raises a specific :class:`SQLError` subclass whose message a model can act on.
A fresh connection serves each query, so concurrent queries in threads never share state.

Example:
    >>> import tempfile, os
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = os.path.join(tmp.name, "t.sqlite")
    >>> with sqlite3.connect(path) as con:
    ...     _ = con.execute("CREATE TABLE t (x INTEGER)")
    ...     _ = con.executemany("INSERT INTO t VALUES (?)", [(1,), (2,), (3,)])
    >>> con.close()
    >>> db = ReadOnlyDatabase(path)
    >>> print(format_table(db.query("SELECT x, x * 2 AS y FROM t ORDER BY x"), max_rows=2))
    x | y
    1 | 2
    2 | 4
    (1 more row)
    >>> db.query("DELETE FROM t")
    Traceback (most recent call last):
    ...
    rlf_envs.tasks.sql.sandbox.ForbiddenQueryError: only a single read-only SELECT (or WITH ... SELECT) statement is allowed; this one starts with DELETE
    >>> tmp.cleanup()
"""

from __future__ import annotations

import re
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 2.0
PROGRESS_EVERY_N_OPS = 1000  # sqlite VM instructions between deadline checks (~tens of microseconds)
MAX_VALUE_BYTES = 1_000_000  # largest string/blob a query may build (stops memory blow-ups early)
MAX_CELL_CHARS = 200  # a cell longer than this is cut in the text table
DEFAULT_COUNT_LIMIT = 100_000  # rows counted past the shown ones before giving "more than N"

_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})
_ACTION_NAMES = {
    getattr(sqlite3, name): name.removeprefix("SQLITE_").replace("_", " ")
    for name in (
        "SQLITE_INSERT", "SQLITE_UPDATE", "SQLITE_DELETE", "SQLITE_ATTACH", "SQLITE_DETACH",
        "SQLITE_PRAGMA", "SQLITE_TRANSACTION", "SQLITE_SAVEPOINT", "SQLITE_ANALYZE", "SQLITE_REINDEX",
        "SQLITE_ALTER_TABLE", "SQLITE_CREATE_TABLE", "SQLITE_CREATE_TEMP_TABLE", "SQLITE_CREATE_INDEX",
        "SQLITE_CREATE_VIEW", "SQLITE_CREATE_TEMP_VIEW", "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_VTABLE",
        "SQLITE_DROP_TABLE", "SQLITE_DROP_INDEX", "SQLITE_DROP_VIEW", "SQLITE_DROP_TRIGGER",
        "SQLITE_DROP_VTABLE", "SQLITE_DROP_TEMP_TABLE", "SQLITE_FUNCTION",
    )
}  # fmt: skip
_LEADING_NOISE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*", re.DOTALL)
_FIRST_WORD = re.compile(r"[A-Za-z_]+")


class SQLError(Exception):
    """A query was not run or did not finish; the message is meant for the model."""


class ForbiddenQueryError(SQLError):
    """Not a single read-only SELECT: a write, DDL, ATTACH, PRAGMA or several statements."""


class QueryTimeoutError(SQLError):
    """The query ran past its time limit and was aborted."""


class QueryError(SQLError):
    """sqlite rejected or failed the query: syntax error, unknown table or column, ..."""


@dataclass(frozen=True)
class QueryResult:
    """Column names, the fetched rows, and how many rows the query produced in all.

    ``total_rows`` counts every row when ``complete``; otherwise counting stopped at a limit
    and the query has more than ``total_rows`` rows.
    """

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    total_rows: int
    complete: bool = True


def check_single_select(query: str) -> str:
    """The statement without trailing ``;`` and comments, if ``query`` is one SELECT/WITH statement.

    Raises :class:`ForbiddenQueryError` for another statement kind or several statements and
    :class:`QueryError` for an empty or unterminated one (an open quote or comment).

    Example:
        >>> check_single_select("  select 1; -- done")
        'select 1'
        >>> check_single_select("SELECT 1; SELECT 2")
        Traceback (most recent call last):
        ...
        rlf_envs.tasks.sql.sandbox.ForbiddenQueryError: only one SQL statement is allowed per query, but text follows the first ';': 'SELECT 2'
    """
    body = query[_LEADING_NOISE.match(query).end() :]  # type: ignore[union-attr]
    if not body.strip():
        raise QueryError("the query is empty: pass one SELECT statement")
    first = _FIRST_WORD.match(body)
    keyword = first.group(0).upper() if first else body.split(None, 1)[0][:20]
    if keyword not in ("SELECT", "WITH"):
        raise ForbiddenQueryError(
            "only a single read-only SELECT (or WITH ... SELECT) statement is allowed;"
            f" this one starts with {keyword}"
        )
    end = _end_of_first_statement(body)
    if end is None:
        if not sqlite3.complete_statement(body + "\n;"):
            raise QueryError("the query is not complete: check for an unclosed quote, bracket or comment")
        return body.rstrip()
    rest = body[end:]
    if rest[_LEADING_NOISE.match(rest).end() :].strip():  # type: ignore[union-attr]
        raise ForbiddenQueryError(
            f"only one SQL statement is allowed per query, but text follows the first ';': {rest.strip()[:60]!r}"
        )
    return body[: end - 1].rstrip()


def _end_of_first_statement(text: str) -> int | None:
    """Index just past the ``;`` that ends the first complete statement, or None if none ends."""
    position = text.find(";")
    while position >= 0:
        # complete_statement knows sqlite's quoting and comment rules, so a ';' inside a
        # string literal or a trigger body does not count as the end
        if sqlite3.complete_statement(text[: position + 1]):
            return position + 1
        position = text.find(";", position + 1)
    return None


def _authorizer(denied: list[str]) -> Callable[[int, str | None, str | None, str | None, str | None], int]:
    def authorize(action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in _DENIED_FUNCTIONS:
            return sqlite3.SQLITE_OK
        what = _ACTION_NAMES.get(action, f"action {action}")
        target = arg2 if action == sqlite3.SQLITE_FUNCTION else arg1
        denied.append(f"{what} {target}" if target else what)
        return sqlite3.SQLITE_DENY

    return authorize


def _uri(path: Path) -> str:
    return f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"


class ReadOnlyDatabase:
    """A sqlite file that model-written queries can read and never change.

    Args:
        path: the database file (must exist; it is never created or written).
        timeout_s: wall-clock limit of one query, fetching included.

    Example:
        >>> from rlf_envs.tasks.sql.data import ensure_database
        >>> db = ReadOnlyDatabase(ensure_database(seed=0), timeout_s=2)
        >>> db.query("SELECT count(*) FROM departments").rows
        [(8,)]
    """

    def __init__(self, path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no sqlite database at {self.path}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        connection = sqlite3.connect(_uri(self.path), uri=True, check_same_thread=False)
        try:
            connection.execute("PRAGMA query_only=ON")
            connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            yield connection
        finally:
            connection.close()

    def query(
        self, sql: str, *, max_rows: int | None = None, count_limit: int = DEFAULT_COUNT_LIMIT
    ) -> QueryResult:
        """Run one SELECT and return at most ``max_rows`` rows (all when None) and the row count.

        Rows past ``max_rows`` are counted (not kept) up to ``count_limit`` more. Raises
        :class:`ForbiddenQueryError`, :class:`QueryTimeoutError` or :class:`QueryError`.
        """
        statement = check_single_select(sql)
        denied: list[str] = []
        deadline = time.monotonic() + self.timeout_s
        with self._connection() as connection:
            connection.set_authorizer(_authorizer(denied))
            connection.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_EVERY_N_OPS)
            try:
                cursor = connection.execute(statement)
                columns = tuple(d[0] for d in cursor.description or ())
                rows = cursor.fetchall() if max_rows is None else cursor.fetchmany(max_rows)
                extra, complete = _count_rest(cursor, max_rows, count_limit)
            except sqlite3.Error as error:
                raise self._translate(error, denied, deadline) from None
        return QueryResult(columns, rows, len(rows) + extra, complete)

    def _translate(self, error: sqlite3.Error, denied: list[str], deadline: float) -> SQLError:
        if denied:
            # pragma_table_info() & co. first ask to update sqlite_master: point at the tool instead
            hint = (
                "; use describe_table to see a table's columns" if "sqlite_master" in " ".join(denied) else ""
            )
            return ForbiddenQueryError(
                f"the query is read-only and may not do this: {', '.join(dict.fromkeys(denied))}{hint}"
            )
        message = str(error)
        if "interrupted" in message and time.monotonic() >= deadline:
            return QueryTimeoutError(
                f"the query ran longer than the {self.timeout_s:g} s limit and was stopped;"
                " avoid unbounded recursion and large cross joins"
            )
        if isinstance(error, sqlite3.ProgrammingError) and "one statement" in message:
            return ForbiddenQueryError("only one SQL statement is allowed per query")
        return QueryError(f"sqlite error: {message}")

    def tables(self) -> list[tuple[str, int]]:
        """``(name, row count)`` of every user table, by name."""
        with self._connection() as connection:
            names = [
                row[0]
                for row in connection.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
                )
            ]
            return [(name, connection.execute(f'SELECT COUNT(*) FROM "{_ident(name)}"').fetchone()[0]) for name in names]  # fmt: skip

    def describe(self, table: str, *, sample_rows: int = 3) -> str:
        """The table's ``CREATE TABLE`` statement and a few sample rows, as text for a model.

        Raises :class:`QueryError` naming the existing tables when ``table`` is unknown.
        """
        with self._connection() as connection:
            found = connection.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE",
                (table.strip().strip('"`[]'),),
            ).fetchone()
            if found is None:
                known = ", ".join(name for name, _ in self.tables())
                raise QueryError(f"no table named {table!r}; the tables are: {known}")
            name, create_sql = found
            cursor = connection.execute(f'SELECT * FROM "{_ident(name)}" LIMIT ?', (sample_rows,))
            columns = tuple(d[0] for d in cursor.description)
            sample = QueryResult(columns, cursor.fetchall(), 0)
        text = f"{create_sql.strip()};"
        if sample.rows:
            text += f"\n\nSample rows:\n{format_table(sample)}"
        return text


def _ident(name: str) -> str:
    return name.replace('"', '""')


def _count_rest(cursor: sqlite3.Cursor, max_rows: int | None, count_limit: int) -> tuple[int, bool]:
    """How many rows the cursor still has, counting at most ``count_limit``; and whether that is all."""
    if max_rows is None:
        return 0, True
    extra = 0
    while extra < count_limit:
        batch = cursor.fetchmany(min(1000, count_limit - extra))
        if not batch:
            return extra, True
        extra += len(batch)
    return extra, cursor.fetchone() is None


def format_cell(value: Any) -> str:
    """One value as table text: NULL, floats without noise, long text cut.

    Example:
        >>> format_cell(None), format_cell(2.50), format_cell(1 / 3)
        ('NULL', '2.5', '0.333333')
    """
    if value is None:
        return "NULL"
    if isinstance(value, float):
        text = f"{value:.6f}".rstrip("0").rstrip(".") if abs(value) < 1e15 else repr(value)
    elif isinstance(value, bytes):
        text = f"<blob {len(value)} bytes>"
    else:
        text = str(value).replace("\n", "\\n")
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 3] + "..."


def format_table(result: QueryResult, max_rows: int | None = None) -> str:
    """A compact text table: header, up to ``max_rows`` rows, then ``(N more rows)``.

    Example:
        >>> print(format_table(QueryResult(("n",), [], 0)))
        n
        (0 rows)
    """
    shown: Sequence[tuple[Any, ...]] = result.rows if max_rows is None else result.rows[:max_rows]
    lines = [" | ".join(result.columns)]
    lines.extend(" | ".join(format_cell(v) for v in row) for row in shown)
    hidden = result.total_rows - len(shown)
    if not result.rows:
        lines.append("(0 rows)")
    elif not result.complete:
        lines.append(f"(more than {hidden} more rows)")
    elif hidden > 0:
        lines.append(f"({hidden} more row{'s' if hidden != 1 else ''})")
    return "\n".join(lines)
