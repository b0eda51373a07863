"""The SQL task: explore a sqlite database with read-only tools, answer with one SELECT in ``<answer>``.

The reward executes the answer in the same read-only sandbox the tools use and compares its
result set with the gold query's (see :mod:`rlf_envs.tasks.sql.compare`). By default the database
and questions are generated from ``seed``; real data (Spider / BIRD style) is a questions file
plus the sqlite file it was written for (see docs/sql.md). Where bubblewrap works (``isolation``
``"auto"`` or ``"bwrap"``), the sqlite server process itself runs under it (see
:func:`rlf_envs.tasks.sql.server.bwrap_entry`); ``info["sandbox"]`` says which mode runs.

Example:
    >>> task = SQLTask(seed=0)
    >>> instance = task.instances("test")[0]
    >>> instance.answer.startswith("SELECT")
    True
"""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path
from typing import Any, Literal

from rlf_envs.core.task import Task
from rlf_envs.isolation import DEFAULT_BWRAP, IsolationMode, probe_bubblewrap, resolve_isolation
from rlf_envs.rewards.rules import episode_prediction
from rlf_envs.servers.launch import stdio_server_entry
from rlf_envs.tasks.sql.compare import has_top_level_order_by, results_match
from rlf_envs.tasks.sql.data import ensure_database, generate_company
from rlf_envs.tasks.sql.questions import SQLQuestion, checked_questions, load_question_file
from rlf_envs.tasks.sql.sandbox import DEFAULT_TIMEOUT_S, QueryResult, ReadOnlyDatabase, SQLError
from rlf_envs.tasks.sql.server import bwrap_entry
from rlf_envs.types import Episode, RewardValue, TaskInstance

SQL_SERVER_MODULE = "rlf_envs.tasks.sql.server"  # this task's MCP server, run as `python -m`

SYSTEM_PROMPT = """\
You answer questions about a database by writing one SQLite query.
You do not know the schema yet: explore it with the tools. `list_tables` lists the tables, \
`describe_table` shows a table's columns and a few rows, and `run_sql` runs a read-only SELECT \
and shows its first rows. Check the exact spelling of values (names, titles, statuses) with \
queries before you rely on them, and test your final query with `run_sql`.
When your query is right, reply with only the query inside <answer> and </answer>, for example:
<answer>SELECT name, age FROM pets WHERE age > 3</answer>
Return exactly the columns the question asks for, in that order, and sort the rows only when \
the question asks for an order."""

GOLD_TIMEOUT_S = 30.0  # gold queries are trusted; real-data golds on big databases may be slow
PRED_ROW_LIMIT = 100_000  # more rows than this is never a match worth checking exactly
_FENCE = re.compile(r"^```[a-zA-Z]*\s*(.*?)\s*```$", re.DOTALL)

RowOrder = bool | Literal["auto"]


def strip_sql(answer: str) -> str:
    """The query inside an answer: code fences and surrounding whitespace removed.

    Example:
        >>> strip_sql("```sql\\nSELECT 1;\\n```")
        'SELECT 1;'
    """
    text = answer.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


class SQLTask(Task):
    """Text-to-SQL with a read-only sqlite MCP server and an execution-match reward.

    Args:
        seed: seed of the generated database and questions (when ``db_path`` is not given).
        max_turns: assistant turns before the episode is truncated.
        db_path: a sqlite file to query instead of the generated one (needs ``questions_path``).
        questions_path: JSONL / JSON-array questions with gold SQL written for ``db_path``.
        max_rows: rows ``run_sql`` shows before ``(N more rows)``.
        row_order_matters: ``"auto"`` compares rows in order only when the gold query has a
            top-level ``ORDER BY``; ``True`` / ``False`` force ordered / multiset comparison.
        timeout_s: time limit of one query, in the tools and when scoring the answer.
        cache_dir: where the generated database is cached (default ``$RLF_CACHE_DIR`` or ``~/.cache/rlf``).
        isolation: ``"auto"`` (run the sqlite server under bubblewrap when it works here),
            ``"bwrap"`` (:class:`rlf_envs.isolation.IsolationUnavailableError` now when it does
            not) or ``"guards"`` (a plain process; the read-only database locks alone).
        bwrap_path: the bubblewrap binary (a name on PATH or a path).
    """

    name = "sql"
    system_prompt = SYSTEM_PROMPT
    answer_tag = "answer"

    def __init__(
        self,
        *,
        seed: int = 0,
        max_turns: int = 5,
        db_path: str | Path | None = None,
        questions_path: str | Path | None = None,
        max_rows: int = 50,
        row_order_matters: RowOrder = "auto",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        cache_dir: str | Path | None = None,
        isolation: str = "auto",
        bwrap_path: str = DEFAULT_BWRAP,
    ) -> None:
        if (db_path is None) != (questions_path is None):
            raise ValueError(
                "real data needs both db_path (the sqlite file) and questions_path (its questions)"
            )
        if row_order_matters not in ("auto", True, False):
            raise ValueError(f'row_order_matters must be "auto", True or False, got {row_order_matters!r}')
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.seed = seed
        self.max_turns = max_turns
        self.questions_path = Path(questions_path) if questions_path is not None else None
        self._db_path = Path(db_path) if db_path is not None else None
        if self._db_path is not None and not self._db_path.is_file():
            raise FileNotFoundError(f"no sqlite database at {self._db_path}")
        self.max_rows = max_rows
        self.row_order_matters = row_order_matters
        self.timeout_s = float(timeout_s)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._gold_results: dict[str, QueryResult | SQLError] = {}
        self.bwrap_path = bwrap_path
        self.isolation = resolve_isolation(
            isolation, bwrap_path=bwrap_path, purpose="RLF/SQL-v0 sqlite server"
        )

    @property
    def db_path(self) -> Path:
        """The database file the tools and the reward query (the generated one is built on first use)."""
        if self._db_path is None:
            self._db_path = ensure_database(self.seed, self.cache_dir)
        return self._db_path

    @functools.cached_property
    def split_instances(self) -> dict[str, list[TaskInstance]]:
        if self.questions_path is not None:
            questions = load_question_file(self.questions_path)
            names = {q.split for q in questions if q.split}
            if any(not q.split for q in questions):
                names |= {"train", "test"}  # records without a split serve every split (one eval file)
            splits = {split: [q for q in questions if q.split in (split, "")] for split in sorted(names)}
        else:
            questions = checked_questions(generate_company(self.seed), self.db_path)
            splits = {split: [q for q in questions if q.split == split] for split in ("train", "test")}
        return {split: [self._instance(q) for q in items] for split, items in splits.items()}

    def _instance(self, question: SQLQuestion) -> TaskInstance:
        ordered = (
            has_top_level_order_by(question.sql)
            if self.row_order_matters == "auto"
            else self.row_order_matters
        )
        metadata = {"kind": question.kind, "template": question.template, "row_order_matters": ordered}
        return TaskInstance(
            id=question.id, question=question.question, answer=question.sql, metadata=metadata
        )

    def mcp_config(self) -> dict[str, Any]:
        """``{"mcpServers": {"sqlite": ...}}`` running our read-only sqlite server on this task's database."""
        db = str(self.db_path.resolve())  # bound at its real path under bwrap
        args = ["--db", db, "--max-rows", str(self.max_rows), "--timeout-s", str(self.timeout_s)]
        # the database never changes, so equal calls give equal results
        entry = stdio_server_entry(SQL_SERVER_MODULE, args, timeout_s=self.timeout_s + 10.0, cache=True)
        bwrap = probe_bubblewrap(self.bwrap_path).bubblewrap
        if self.isolation is IsolationMode.BWRAP and bwrap is not None:
            entry = bwrap_entry(entry, db, bwrap)
        return {"mcpServers": {"sqlite": entry}}

    def env_info(self) -> dict[str, Any]:
        """``{"sandbox": {"isolation": "bwrap" | "guards", ...}}``: how the sqlite server process runs."""
        bwrap = probe_bubblewrap(self.bwrap_path).bubblewrap
        if self.isolation is IsolationMode.BWRAP and bwrap is not None:
            return {"sandbox": bwrap.info()}
        return {"sandbox": {"isolation": self.isolation.value}}

    def _database(self, timeout_s: float) -> ReadOnlyDatabase:
        return ReadOnlyDatabase(self.db_path, timeout_s=timeout_s)

    async def gold_result(self, instance: TaskInstance) -> QueryResult | SQLError:
        """The gold query's result (computed once per query, in a thread), or why it failed."""
        sql = str(instance.answer)
        if sql not in self._gold_results:
            database = self._database(max(self.timeout_s, GOLD_TIMEOUT_S))
            try:
                result: QueryResult | SQLError = await asyncio.to_thread(database.query, sql)
            except SQLError as error:
                result = error
            self._gold_results[sql] = result
        return self._gold_results[sql]

    async def reward(self, episode: Episode) -> RewardValue:
        """1.0 when the answer's result set equals the gold query's, else 0.0.

        Example:
            >>> import asyncio
            >>> from rlf_envs.types import Episode
            >>> task = SQLTask(seed=0)
            >>> instance = task.instances("test")[0]
            >>> def answered(sql):
            ...     return Episode(instance, [], f"<answer>{sql}</answer>", None, [], 1, True, False)
            >>> asyncio.run(task.reward(answered(instance.answer)))   # the gold query itself
            {'reward': 1.0, 'executed': True, 'error': None, 'gold_rows': 7, 'pred_rows': 7}
            >>> scores = asyncio.run(task.reward(answered("DROP TABLE employees")))
            >>> scores["reward"], scores["executed"], scores["error"].split(":")[0]
            (0.0, False, 'ForbiddenQueryError')
        """
        scores: dict[str, Any] = {
            "reward": 0.0,
            "executed": False,
            "error": None,
            "gold_rows": 0,
            "pred_rows": 0,
        }
        gold = await self.gold_result(episode.instance)
        if isinstance(gold, SQLError):
            return {**scores, "error": f"the gold query failed: {gold}", "gold_error": True}
        scores["gold_rows"] = gold.total_rows
        answer = episode_prediction(episode, self.answer_tag)
        if answer is None or not strip_sql(answer):
            return {**scores, "error": "no SQL query inside <answer>...</answer>"}
        try:
            pred = await asyncio.to_thread(
                self._database(self.timeout_s).query,
                strip_sql(answer),
                max_rows=PRED_ROW_LIMIT,
                count_limit=1,
            )
        except SQLError as error:
            return {**scores, "error": f"{type(error).__name__}: {error}"}
        ordered = bool(
            episode.instance.metadata.get(
                "row_order_matters", has_top_level_order_by(str(episode.instance.answer))
            )
        )
        match = pred.complete and results_match(gold.rows, pred.rows, ordered=ordered)
        return {**scores, "reward": float(match), "executed": True, "pred_rows": pred.total_rows}
