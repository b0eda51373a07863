"""MCP server over one sqlite file, read-only: ``list_tables``, ``describe_table`` and ``run_sql``.

``run_sql`` accepts a single SELECT (or WITH ... SELECT) statement and returns a compact text
table: the header, at most ``--max-rows`` rows, then ``(N more rows)``. Writes, DDL, ATTACH,
PRAGMA, several statements and queries running past ``--timeout-s`` come back as MCP errors
(``isError``) with a message the model can act on; the file itself is opened read-only (see
:mod:`rlf_envs.tasks.sql.sandbox` for every lock). Each call runs in a worker thread on its own
connection, so concurrent calls overlap. :func:`bwrap_entry` wraps the server's stdio entry so
that the whole server process runs under bubblewrap (no network, a read-only view of only the
interpreter, its installed packages, the rlf_envs and envs_registry folders and the database file).

Example:
    python -m rlf_envs.tasks.sql.server --db ~/.cache/rlf/sql/seed0.sqlite --max-rows 50 --timeout-s 2
    python -m rlf_envs.tasks.sql.server --seed 0 --transport http --port 8771
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from rlf_envs.isolation import Bubblewrap, Layout, package_roots
from rlf_envs.servers.launch import add_transport_args, serve_or_exit
from rlf_envs.tasks.sql.sandbox import DEFAULT_TIMEOUT_S, ReadOnlyDatabase, SQLError, format_table

T = TypeVar("T")
# what the server imports from the checkout; nothing else of it is visible under bwrap
SERVER_PACKAGES = ("rlf_envs", "envs_registry")

LIST_TABLES_DESCRIPTION = "List the database's tables with their row counts."
DESCRIBE_TABLE_DESCRIPTION = (
    "Show a table's CREATE TABLE statement (columns, types, keys) and a few sample rows."
)
RUN_SQL_DESCRIPTION = (
    "Run one read-only SQLite SELECT (or WITH ... SELECT) query and return its rows as a text table "
    "(header, then at most {max_rows} rows, then how many more there are). Writes are not allowed."
)


async def _in_thread(fn: Callable[[], T]) -> T:
    """Run a blocking database call in a worker thread; its errors become MCP tool errors."""
    try:
        return await anyio.to_thread.run_sync(fn)
    except SQLError as error:
        raise ToolError(str(error)) from None


def build_server(database: ReadOnlyDatabase, *, max_rows: int = 50, name: str = "rlf-sqlite") -> MCPServer:
    """An MCP server exposing ``list_tables``, ``describe_table`` and ``run_sql`` over ``database``.

    Example:
        >>> # build_server(ReadOnlyDatabase("company.sqlite", timeout_s=2)).run("stdio")
    """
    server = MCPServer(name=name, instructions="Read-only SQL access to one sqlite database.")

    @server.tool(description=LIST_TABLES_DESCRIPTION)
    async def list_tables() -> str:
        tables = await _in_thread(database.tables)
        return "\n".join(f"{table} ({count} rows)" for table, count in tables) or "(no tables)"

    @server.tool(description=DESCRIBE_TABLE_DESCRIPTION)
    async def describe_table(table: str) -> str:
        return await _in_thread(functools.partial(database.describe, table))

    @server.tool(description=RUN_SQL_DESCRIPTION.format(max_rows=max_rows))
    async def run_sql(query: str) -> str:
        result = await _in_thread(functools.partial(database.query, query, max_rows=max_rows))
        return format_table(result, max_rows)

    return server


def bwrap_entry(entry: dict[str, Any], db_path: str | Path, bwrap: Bubblewrap) -> dict[str, Any]:
    """The stdio ``mcpServers`` entry ``entry`` (``python -m rlf_envs.tasks.sql.server ...``) run under bwrap.

    Example:
        >>> from rlf_envs.servers.launch import stdio_server_entry
        >>> entry = stdio_server_entry("rlf_envs.tasks.sql.server", ["--db", "/data/x.sqlite"])
        >>> wrapped = bwrap_entry(entry, "/data/x.sqlite", Bubblewrap("/usr/bin/bwrap", "0.8.0"))
        >>> wrapped["command"], wrapped["args"][-4:]
        ('/usr/bin/bwrap', ['-m', 'rlf_envs.tasks.sql.server', '--db', '/data/x.sqlite'])
    """
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",  # the packages are read-only inside
        **{key: value for key, value in entry.get("env", {}).items() if key == "PYTHONPATH"},
    }
    layout = Layout(read_only=(*package_roots(*SERVER_PACKAGES), str(db_path)), env=env)
    command = bwrap.command([entry["command"], *entry["args"]], layout)
    return {**entry, "command": command[0], "args": command[1:]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlf_envs.tasks.sql.server", description=__doc__.split("\n\n")[0]
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", type=Path, help="the sqlite file to serve (opened read-only)")
    source.add_argument("--seed", type=int, help="serve the generated company database of this seed")
    parser.add_argument("--cache-dir", type=Path, default=None, help="with --seed: cache root (default $RLF_CACHE_DIR or ~/.cache/rlf)")  # fmt: skip
    parser.add_argument("--max-rows", type=int, default=50, help="rows run_sql shows before '(N more rows)'")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="time limit of one query")
    add_transport_args(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.max_rows < 1:
        print(f"sqlite server: --max-rows must be >= 1, got {args.max_rows}", file=sys.stderr)
        return 2
    if args.db is None:
        from rlf_envs.tasks.sql.data import ensure_database  # the generator is only needed here

        args.db = ensure_database(args.seed, args.cache_dir)
    return serve_or_exit(
        "sqlite server",
        args,
        lambda: build_server(ReadOnlyDatabase(args.db, timeout_s=args.timeout_s), max_rows=args.max_rows),
        (FileNotFoundError, ValueError),
    )


if __name__ == "__main__":
    sys.exit(main())
