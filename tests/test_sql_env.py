"""RLF/SQL-v0 over the real sqlite MCP server (stdio and streamable HTTP subprocesses) and real files."""

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rlf_envs  # noqa: F401
from rlf_envs.isolation import IsolationUnavailableError, probe_bubblewrap
from rlf_envs.tasks.sql import (
    ForbiddenQueryError,
    QueryError,
    ReadOnlyDatabase,
    SQLTask,
    check_single_select,
    ensure_database,
    generate_company,
    has_top_level_order_by,
    load_question_file,
    results_match,
)
from rlf_envs.tasks.sql.data import database_path
from tests.helpers import free_local_port, http_server


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def answer(sql):
    return f"<answer>{sql}</answer>"


def file_hash(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    """Every env of this module builds its database under a fresh cache, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        directory = tmp_path_factory.mktemp("rlf-cache")
        patch.setenv("RLF_CACHE_DIR", str(directory))
        yield directory


@pytest.fixture(scope="module")
def task():
    return SQLTask(seed=0)


@pytest.fixture(scope="module")
def env():
    """One single env (one stdio server) shared by the tests that reset it; queries time out at 0.5 s."""
    env = gym.make("RLF/SQL-v0", timeout_s=0.5)
    yield env
    env.close()


def test_database_is_deterministic_cached_and_rebuilt_when_stale(tmp_path):
    first = ensure_database(3, tmp_path / "a")
    assert first == database_path(3, tmp_path / "a") and first.name == "seed3.sqlite"
    assert file_hash(first) == file_hash(ensure_database(3, tmp_path / "b"))
    assert file_hash(first) != file_hash(ensure_database(4, tmp_path / "a"))
    reused_inode = first.stat().st_ino
    assert ensure_database(3, tmp_path / "a").stat().st_ino == reused_inode  # reused, not rebuilt
    first.write_bytes(b"not a database")
    assert file_hash(ensure_database(3, tmp_path / "a")) == file_hash(tmp_path / "b" / "sql" / "seed3.sqlite")
    assert sorted(p.name for p in first.parent.iterdir()) == [
        "seed3.sqlite",
        "seed4.sqlite",
    ]  # no temporaries


def test_every_gold_query_runs_and_returns_rows(task):
    train, test = task.instances("train"), task.instances("test")
    assert len(train) + len(test) >= 250 and len(test) >= 50
    assert not {i.id for i in train} & {i.id for i in test}
    assert {i.metadata["kind"] for i in test} == {
        *("filter", "join", "aggregate", "group_by", "having", "order_limit", "nested")
    }
    database = ReadOnlyDatabase(task.db_path)
    for instance in [*train, *test]:
        result = database.query(instance.answer)
        assert result.rows, instance.id
        assert instance.metadata["row_order_matters"] == ("ORDER BY" in instance.answer)
    assert [i.question for i in test] == [i.question for i in SQLTask(seed=0).instances("test")]
    assert [i.question for i in test] != [i.question for i in SQLTask(seed=1).instances("test")]


def test_sql_env_passes_check_env(env):
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert obs == info["messages"][1]["content"] and "CREATE TABLE" not in obs  # the schema is explored
    assert {t["function"]["name"] for t in info["tools"]} == {"list_tables", "describe_table", "run_sql"}


def test_scripted_agents_in_a_vector_env(task):
    test_questions = task.instances("test")[:8]
    n = len(test_questions)
    scripts = [
        [call("list_tables"), call("run_sql", query=q.answer), answer(q.answer)] for q in test_questions
    ]
    scripts += [[call("describe_table", table="departments"), answer("SELECT name FROM departments")]] * n
    scripts += [[answer("SELECT nope FROM employees")]] * n
    envs = gym.make_vec("RLF/SQL-v0", num_envs=3 * n, split="test", autoreset_mode="Disabled")
    envs.reset(seed=0, options={"task_indices": list(range(n)) * 3})
    final = {}
    for turn in range(3):
        actions = [s[turn] if turn < len(s) else "" for s in scripts]
        obs, rewards, terminated, truncated, infos = envs.step(actions)
        for i in range(3 * n):
            if i not in final and (terminated[i] or truncated[i]):
                reward_info = {key: values[i] for key, values in infos["reward_info"].items()}
                final[i] = (rewards[i], reward_info, terminated[i])
            elif i not in final:
                assert infos["errors"][i] == [], obs[i]
                if turn == 0 and i < n:
                    assert "employees (" in obs[i] and "sales (" in obs[i]
                if turn == 0 and i >= n:
                    assert "CREATE TABLE departments" in obs[i]
    envs.close()
    assert all(terminated for _, _, terminated in final.values()) and len(final) == 3 * n
    for i in range(n):
        reward, info, _ = final[i]
        assert reward == 1.0 and info["executed"] and info["error"] is None
        assert info["gold_rows"] == info["pred_rows"] > 0
    for i in range(n, 2 * n):
        reward, info, _ = final[i]
        assert reward == 0.0 and info["executed"] and info["pred_rows"] == 8
    for i in range(2 * n, 3 * n):
        reward, info, _ = final[i]
        assert reward == 0.0 and not info["executed"] and "no such column: nope" in info["error"]


def _index_of(task, template, split="train"):
    return next(i for i, q in enumerate(task.instances(split)) if q.metadata["template"] == template)


def test_equivalent_queries_score_and_different_ones_do_not(task, env):
    title_q = _index_of(task, "title_and_salary")
    gold = task.instances("train")[title_q].answer  # ... WHERE title = 'X' AND salary > N
    where = gold.split(" WHERE ")[1]
    title, threshold = where.split("title = ")[1].split(" AND ")[0], where.rsplit("> ", 1)[1]
    average_q = _index_of(task, "average_salary_of_department")
    dept = task.instances("train")[average_q].answer.rsplit("= ", 1)[1]
    top_q = _index_of(task, "top_paid_in_department")
    top_gold = task.instances("train")[top_q].answer
    cases = [
        (
            title_q,
            f"SELECT first_name, last_name FROM employees WHERE NOT salary <= {threshold} AND title IN ({title})",
            1.0,
        ),  # fmt: skip
        (
            title_q,
            f"```sql\n{gold} ORDER BY last_name DESC;\n```",
            1.0,
        ),  # order is free when the question sets none
        (title_q, gold.replace("first_name, last_name", "last_name, first_name"), 0.0),  # reordered columns
        (
            title_q,
            gold.replace("first_name, last_name", "first_name, last_name, salary"),
            0.0,
        ),  # extra column
        (title_q, gold.replace(f"> {threshold}", f">= {int(threshold) - 10**6}"), 0.0),  # too many rows
        (
            average_q,
            f"SELECT SUM(salary) * 1.0 / COUNT(*) FROM employees WHERE department_id = (SELECT id FROM departments WHERE name = {dept})",
            1.0,
        ),  # fmt: skip
        (top_q, top_gold, 1.0),
        (top_q, f"SELECT * FROM ({top_gold}) ORDER BY salary ASC", 0.0),  # same rows, wrong order
    ]
    for index, sql, expected in cases:
        env.reset(seed=0, options={"task_index": index})
        _, reward, terminated, _, info = env.step(answer(sql))
        assert terminated and reward == expected, (sql, info["reward_info"])
        assert info["reward_info"]["executed"], info["reward_info"]


def _episode(instance, final_response):
    from rlf_envs.answers import extract_answer
    from rlf_envs.types import Episode

    return Episode(instance, [], final_response, extract_answer(final_response), [], 1, True, False)


def test_row_order_can_be_forced_and_answers_that_write_score_zero(task):
    index = _index_of(task, "top_paid_in_department")
    reversed_sql = f"SELECT * FROM ({task.instances('train')[index].answer}) ORDER BY salary ASC"
    scores = {}
    for order in ("auto", True, False):
        forced = SQLTask(seed=0, row_order_matters=order)
        instance = forced.instances("train")[index]
        scores[order] = asyncio.run(forced.reward(_episode(instance, answer(reversed_sql))))["reward"]
    assert scores == {"auto": 0.0, True: 0.0, False: 1.0}
    before = file_hash(task.db_path)
    for sql in ("DELETE FROM employees", "UPDATE employees SET salary = 0", "CREATE TABLE x (a)"):
        info = asyncio.run(task.reward(_episode(task.instances("train")[index], answer(sql))))
        assert info["reward"] == 0.0 and not info["executed"] and "ForbiddenQueryError" in info["error"]
    no_answer = asyncio.run(task.reward(_episode(task.instances("train")[index], "I give up")))
    assert no_answer["reward"] == 0.0 and "no SQL query" in no_answer["error"]
    assert file_hash(task.db_path) == before


ATTACKS = {
    "DELETE FROM employees": "starts with DELETE",
    "DROP TABLE employees": "starts with DROP",
    "ATTACH DATABASE 'other.sqlite' AS other": "starts with ATTACH",
    "PRAGMA writable_schema=1": "starts with PRAGMA",
    "SELECT 1; DROP TABLE employees": "only one SQL statement is allowed",
    "WITH doomed AS (SELECT id FROM employees) DELETE FROM employees WHERE id IN doomed": "may not do this: DELETE",
    "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT max(x) FROM n": "longer than the 0.5 s limit",
    "SELECT * FROM pragma_table_info('employees')": "use describe_table",
}


def test_run_sql_refuses_writes_and_runaway_queries_and_the_file_is_unchanged(task, env):
    before = file_hash(task.db_path)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("".join(call("run_sql", query=q) for q in ATTACKS))
    assert not terminated and not truncated and reward == 0.0
    assert info["errors"] == ["tool_error"] * len(ATTACKS)
    for message, expected in zip(info["tool_messages"], ATTACKS.values(), strict=True):
        assert message["content"].startswith("Error (tool_error)") and expected in message["content"], message
    obs, _, _, _, info = env.step(call("run_sql", query="SELECT COUNT(*) AS n FROM employees"))
    assert (
        info["errors"] == []
        and info["tool_messages"][0]["content"] == f"n\n{len(generate_company(0).employees)}"
    )
    assert file_hash(task.db_path) == before


def test_single_statement_check_reads_sql_like_sqlite():
    assert check_single_select("SELECT ';' AS semi; -- trailing comment") == "SELECT ';' AS semi"
    assert check_single_select("/* lead */ with t AS (SELECT 1) SELECT * FROM t") == (
        "with t AS (SELECT 1) SELECT * FROM t"
    )
    with pytest.raises(ForbiddenQueryError, match="only one SQL statement"):
        check_single_select("SELECT 1;SELECT 2")
    with pytest.raises(ForbiddenQueryError, match="starts with INSERT"):
        check_single_select("-- sneaky\nINSERT INTO t VALUES (1)")
    with pytest.raises(QueryError, match="not complete"):
        check_single_select("SELECT 'open")
    assert has_top_level_order_by("SELECT a FROM t ORDER BY a")
    assert not has_top_level_order_by("SELECT a FROM (SELECT a FROM t ORDER BY a LIMIT 2) -- order by")
    assert results_match([(1 / 3, 2.0)], [(0.33333333, 2)], ordered=True)
    assert not results_match([(1,), (1,)], [(1,)], ordered=False)  # multisets: duplicates count


def test_server_over_http_shows_row_limit_and_describes_tables(task):
    port = free_local_port()
    argv = [sys.executable, "-m", "rlf_envs.tasks.sql.server", "--db", str(task.db_path), "--max-rows", "5"]
    with http_server(argv, port):
        servers = {"mcpServers": {"sqlite": {"url": f"http://127.0.0.1:{port}/mcp"}}}
        env = gym.make("RLF/SQL-v0", mcp_servers=servers)
        env.reset(seed=0)
        obs, _, _, _, info = env.step(
            call("run_sql", query="SELECT id, first_name FROM employees ORDER BY id")
            + call("describe_table", table="sales")
            + call("describe_table", table="customers")
        )
        env.close()
    with sqlite3.connect(task.db_path) as connection:
        employee_count = connection.execute("SELECT COUNT(*) FROM employees").fetchone()[0]
    table, description, missing = (m["content"] for m in info["tool_messages"])
    lines = table.split("\n")
    assert lines[0] == "id | first_name" and [line.split(" | ")[0] for line in lines[1:6]] == [
        "1",
        "2",
        "3",
        "4",
        "5",
    ]
    assert lines[6:] == [f"({employee_count - 5} more rows)"]
    assert (
        "CREATE TABLE sales" in description and "amount REAL" in description and "Sample rows:" in description
    )
    assert (
        info["errors"] == ["tool_error"] and "no table named 'customers'" in missing and "projects" in missing
    )


def test_real_data_questions_over_your_own_database(tmp_path):
    db_path = tmp_path / "concert_singer.sqlite"
    with sqlite3.connect(db_path) as connection:
        connection.execute("CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, age INTEGER)")
        connection.executemany(
            "INSERT INTO singer VALUES (?, ?, ?)", [(1, "Ana", 31), (2, "Bo", 44), (3, "Cy", 27)]
        )
    records = [
        {
            "db_id": "concert_singer",
            "question": "How many singers are there?",
            "query": "SELECT count(*) FROM singer",
        },
        {
            "db_id": "concert_singer",
            "question": "Names of singers older than 30?",
            "SQL": "SELECT name FROM singer WHERE age > 30;",
        },  # fmt: skip
        {"db_id": "other_db", "question": "Not ours", "query": "SELECT 1"},
    ]
    spider_file = tmp_path / "dev.json"
    spider_file.write_text(json.dumps(records))
    assert [q.sql for q in load_question_file(spider_file, db_id="concert_singer")] == [
        "SELECT count(*) FROM singer",
        "SELECT name FROM singer WHERE age > 30",
    ]
    jsonl = tmp_path / "questions.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records[:2]))
    env = gym.make("RLF/SQL-v0", db_path=str(db_path), questions_path=str(jsonl))
    rewards = Counter()
    for index, sql in [(0, "SELECT COUNT(singer_id) FROM singer"), (1, "SELECT name FROM singer WHERE age >= 31"), (1, "SELECT name FROM singer")]:  # fmt: skip
        env.reset(seed=0, options={"task_index": index, "split": "test"})
        obs, *_ = env.step(call("list_tables"))
        assert obs.count("singer (3 rows)") == 1
        rewards[env.step(answer(sql))[1]] += 1
    env.close()
    assert rewards == {1.0: 2, 0.0: 1}


def _sqlite_servers_under_bwrap():
    """Host pids of sqlite servers whose parent is bwrap."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            parent = (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            parent_name = Path(f"/proc/{parent}/comm").read_text().strip()
        except OSError:
            continue
        if b"rlf_envs.tasks.sql.server" in cmdline and parent_name == "bwrap":
            pids.append(int(proc.name))
    return pids


@pytest.mark.skipif(probe_bubblewrap().bubblewrap is None, reason="bubblewrap is not usable here")
def test_sqlite_server_runs_under_bwrap_and_sees_only_what_it_needs(env, task):
    _, info = env.reset(seed=0)
    assert info["sandbox"]["isolation"] == "bwrap" and env.unwrapped.task.isolation.value == "bwrap"
    repo = Path(__file__).resolve().parent.parent
    pids = _sqlite_servers_under_bwrap()
    assert pids, "no sqlite server running under bwrap"
    for pid in pids:  # /proc/PID/root is the server's own view of the file system
        root = Path(f"/proc/{pid}/root")
        assert (root / str(task.db_path.resolve()).lstrip("/")).is_file()
        assert (root / str(repo / "rlf_envs" / "__init__.py").lstrip("/")).is_file()
        for hidden in (repo / "README.md", repo / "tests", Path("/etc/passwd")):
            assert not (root / str(hidden).lstrip("/")).exists(), hidden


def test_sqlite_isolation_can_be_forced_off_and_demanding_a_missing_bwrap_fails():
    plain = SQLTask(seed=0, isolation="guards")
    assert plain.env_info() == {"sandbox": {"isolation": "guards"}}
    assert plain.mcp_config()["mcpServers"]["sqlite"]["command"] == sys.executable
    with pytest.raises(IsolationUnavailableError, match="apt-get install bubblewrap"):
        SQLTask(seed=0, isolation="bwrap", bwrap_path="/nonexistent/bwrap")


def test_sql_modules_never_import_torch():
    code = (
        "import sys, rlf_envs.tasks.sql.task, rlf_envs.tasks.sql.server\n"
        "print(sorted(m for m in ('torch', 'transformers', 'vllm', 'rlf_trainer') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
