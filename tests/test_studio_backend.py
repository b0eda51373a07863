"""RLF Studio's backends without a browser: what each tab does behind its buttons.

The servers, envs and configs are the real ones (the latency MCP server, ``RLF/ToolUse-v0``, the
trainer's own config loader); only the page is left out (tests/test_studio_browser.py drives it).
"""

from __future__ import annotations

import ast
import asyncio
import html
import json
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

from rlf_studio.data import DataError, map_records, read_records, save_tasks, split_records
from rlf_studio.project import Project, ProjectError, create_project, list_projects, open_project
from rlf_studio.rewards import (
    RewardSpecError,
    build_reward,
    load_project_reward,
    load_python_reward,
    preview,
    sample_episode,
)
from rlf_studio.runner import RunProcess
from rlf_studio.runs import curve_rows, metric_keys, rollouts_html
from rlf_studio.tools import BUNDLED_SERVERS, add_bundled, check_mcp_json, connect
from tests.helpers import REPO
from tests.studio_fixtures.page import Tabs, page_tabs

FIXTURES = REPO / "tests" / "studio_fixtures"


def _run(coro):
    return asyncio.run(coro)


# --- projects ------------------------------------------------------------------------------------


def test_projects_create_open_list(tmp_path: Path) -> None:
    project = create_project(tmp_path, "alpha")
    assert open_project(tmp_path, "alpha").root == project.root.resolve()
    assert open_project(tmp_path, str(project.root)).name == "alpha"
    assert [p.name for p in list_projects(tmp_path)] == ["alpha"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "file.txt").write_text("x")
    with pytest.raises(ProjectError, match="not an RLF Studio project"):
        create_project(tmp_path, "other")
    with pytest.raises(ProjectError, match="create it first"):
        open_project(tmp_path, "missing")


def test_create_says_when_it_reopens_an_existing_project(tmp_path: Path) -> None:
    """Create with a name in use reopens that project (nothing is overwritten) and must say so."""
    from rlf_studio.ui.common import Studio

    tabs = page_tabs(Studio(tmp_path))
    assert tabs.projects.on_create("beta")[0] == "**Done:** created project 'beta'"
    (tmp_path / "beta" / "tasks" / "train.jsonl").write_text('{"id": "0", "question": "q", "answer": "a"}\n')
    assert tabs.projects.on_create("beta")[0] == "**Done:** reopened the existing project 'beta'"
    assert (tmp_path / "beta" / "tasks" / "train.jsonl").read_text().startswith('{"id": "0"')


# --- tools ---------------------------------------------------------------------------------------


def test_mcp_json_messages() -> None:
    assert check_mcp_json("{")[1].startswith("Invalid JSON: ")
    assert check_mcp_json("[]")[1] == "Invalid JSON: expected an object {...}, got list"
    assert 'needs "command"' in check_mcp_json('{"mcpServers": {"a": {}}}')[1]
    config, message = check_mcp_json('{"a": {"url": "http://127.0.0.1:9/mcp"}}')
    assert (
        config == {"mcpServers": {"a": {"url": "http://127.0.0.1:9/mcp"}}}
        and message == "1 server(s): a (http)"
    )


@pytest.mark.parametrize("name", sorted(BUNDLED_SERVERS))
def test_bundled_servers_are_valid_entries(name: str) -> None:
    config, _ = add_bundled('{"mcpServers": {"keep": {"command": "x"}}}', name)
    assert set(config["mcpServers"]) == {"keep", name}
    assert check_mcp_json(json.dumps(config))[0] is not None


BUNDLED_CALLS = {
    "search": ("search", {"query": "river"}),
    "sqlite": ("run_sql", {"query": "SELECT 1 AS one"}),
    "python": ("run_python", {"code": "print(6 * 7)"}),
}


@pytest.mark.parametrize("name", sorted(BUNDLED_CALLS))
def test_bundled_servers_start_and_answer(name: str) -> None:
    session, message = connect(add_bundled("{}", name)[0])
    assert session is not None, message
    try:
        tool, arguments = BUNDLED_CALLS[name]
        assert tool in {s.name for s in session.specs()}
        outcome = session.call(tool, arguments)
        assert outcome.ok, outcome.text
    finally:
        session.close()


def test_tool_session_calls_and_error_kinds() -> None:
    session, message = connect(add_bundled("{}", "latency")[0])
    assert session is not None, message
    try:
        assert {"sleep", "stats"} <= {s.name for s in session.specs()}
        outcome = session.call("sleep", {"ms": 1, "payload": "hi"})
        assert outcome.ok and outcome.text == "slept 1.0 ms: hi" and outcome.latency_ms >= 1.0
        assert session.call("sleep", {"ms": "soon"}).error_kind == "bad_arguments"
        assert session.call("nope", {}).error_kind == "unknown_tool"
    finally:
        session.close()


def test_failing_server_command_is_a_message() -> None:
    session, message = connect({"mcpServers": {"broken": {"command": "/nonexistent/rlf-no-such-server"}}})
    assert session is None and message.startswith("Server failed to start: broken:")


def _broken(command: str) -> str:
    return json.dumps({"mcpServers": {"broken": {"command": command}}})


@pytest.mark.parametrize(
    ("command", "why"),
    [("/nonexistent/rlf-no-such-server", "does not exist"), ("rlf-no-such-server", "is not on PATH")],
)
def test_save_refuses_a_command_connect_reports_missing(
    project: Project, tabs: Tabs, command: str, why: str
) -> None:
    path, saved = str(project.root), project.mcp_path.read_text()
    assert tabs.tools.on_connect(path, _broken(command))[0].startswith(
        "**Error:** Server failed to start: broken:"
    )
    status = html.unescape(tabs.tools.on_save(path, _broken(command)))
    assert (
        status
        == f"**Error:** server 'broken': the command {command!r} {why}"
        + (" (install it, or give its full path)" if why == "is not on PATH" else "")
        + " (nothing saved)"
    )
    assert project.mcp_path.read_text() == saved
    assert why in tabs.tools.on_validate(_broken(command))  # Validate and Save give one verdict
    latency = json.dumps(add_bundled("{}", "latency")[0])
    assert tabs.tools.on_save(path, latency).startswith("**Done:** saved mcp.json")


def test_a_failed_connect_keeps_the_last_good_tools(
    project: Project, tabs: Tabs, tiny_model_dir: Path
) -> None:
    path, model = str(project.root), str(tiny_model_dir)
    status, table, _ = tabs.tools.on_connect(path, project.mcp_path.read_text())
    assert status.startswith("**Done:** connected") and "sleep" in list(table["tool"])
    count = tabs.tools.on_count(path, model)
    assert "tool schema(s) take" in count
    status, table, choices = tabs.tools.on_connect(path, _broken("/nonexistent/rlf-no-such-server"))
    # the tools list and the tool picker are left as they were (gr.skip), not emptied
    assert isinstance(table, dict) and table == choices == {"__type__": "update"}
    assert tabs.tools.on_count(path, model) == count
    called, result = tabs.tools.on_call(path, "sleep", '{"ms": 1, "payload": "still here"}')
    assert called.startswith("**Done:** **ok**") and result == "slept 1.0 ms: still here"
    assert "Server failed to start" in status and "still those of the last Connect" in status


# --- data ----------------------------------------------------------------------------------------


def test_read_records_formats_and_errors(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    rows = read_records(FIXTURES / "tasks.jsonl")
    assert rows[0]["golden_answers"] == ["ping"]
    (tmp_path / "t.json").write_text(json.dumps({"tasks": rows}))
    assert read_records(tmp_path / "t.json") == rows
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "t.parquet")
    assert map_records(read_records(tmp_path / "t.parquet"), "question", "golden_answers")[0]["answer"] == [
        "ping"
    ]
    (tmp_path / "bad.jsonl").write_text('{"question": "a"}\n{"question": \n')
    with pytest.raises(DataError, match="line 2 of bad.jsonl is not valid JSON"):
        read_records(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="row 1: the question column 'question' must be non-empty text"):
        map_records([{"question": 3, "answer": "x"}], "question", "answer")


def test_a_rejected_file_leaves_an_empty_table_with_the_task_columns(tabs: Tabs) -> None:
    """Not a table without columns: the page drew one as Gradio's placeholder headers "1 2 3"."""
    status, rows, *_, table = tabs.data.on_upload(str(FIXTURES / "tasks.csv"))
    assert "tasks.csv is not a task file" in status and rows == []
    assert list(table.columns) == ["id", "question", "answer"] and table.empty
    assert list(tabs.data.on_project("")[1].columns) == ["id", "question", "answer"]


def test_saved_tasks_load_in_the_env(project: Project) -> None:
    train, test = split_records(
        map_records(read_records(FIXTURES / "tasks.jsonl"), "question", "golden_answers"), 0.25
    )
    save_tasks(project, train, test, {"file": "tasks.jsonl"})
    env = gym.make("RLF/ToolUse-v0", tasks=str(project.train_tasks), test_tasks=str(project.test_tasks))
    try:
        assert env.unwrapped.num_tasks("train") == 3 and env.unwrapped.num_tasks("test") == 1
    finally:
        env.close()


# --- rewards -------------------------------------------------------------------------------------


def test_composed_reward_weights_and_report() -> None:
    reward = build_reward({"components": [{"name": "f1", "weight": 0.5}, {"name": "format", "weight": 0.5}]})
    info = _run(reward(sample_episode("Q", ["Kelmar river"], "<answer>Kelmar</answer>")))
    assert info["reward"] == pytest.approx(0.5 * 2 / 3 + 0.5) and info["format"] == 1.0 and "em" in info


def test_python_reward_file_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.py"
    good.write_text("def score(episode):\n    return {'reward': float(episode.final_answer == 'x')}\n")
    spec = {
        "components": [{"name": "python", "weight": 1}],
        "python": {"file": str(good), "function": "score"},
    }
    assert preview(spec, [["Q", "x", "<answer>x</answer>"]])[0][0][3] == 1.0
    with pytest.raises(RewardSpecError, match="has no function 'nope'; it has: score"):
        load_python_reward(good, "nope")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('at import')\n")
    with pytest.raises(RewardSpecError, match="importing broken.py raised RuntimeError: at import"):
        load_python_reward(broken, "reward")
    raising = dict(spec, python={"file": str(FIXTURES / "raising_reward.py"), "function": "reward"})
    rows, errors = preview(raising, [["Q", "x", "<answer>x</answer>"]])
    assert rows[0][3] is None and errors == [
        "sample 1: the reward raised ZeroDivisionError: division by zero"
    ]
    with pytest.raises(RewardSpecError, match="pick at least one reward"):
        build_reward({"components": []})


# --- training ------------------------------------------------------------------------------------


def test_train_config_is_the_trainers_and_imports_the_composed_reward(project: Project) -> None:
    from rlf_studio.training import TrainForm, command, config_dict, load_form, save_config
    from rlf_trainer.config import load_config

    project.write_json(
        project.reward_path,
        {"components": [{"name": "exact_match", "weight": 0.9}, {"name": "format", "weight": 0.1}]},
    )
    form = TrainForm(
        model="/models/tiny", run_name="r1", max_steps=3, launcher="accelerate", accelerate_config="a.yaml"
    )
    path = save_config(project, config_dict(project, form))
    config = load_config(path)
    assert config.env.import_kwargs == {"reward": "studio_reward:reward"}
    assert (
        config.env.kwargs["mcp_servers"] == str(project.mcp_path)
        and config.run_dir == project.runs_dir / "r1"
    )
    assert load_form(project, "r1").max_steps == 3
    argv = command(path, form)
    assert argv[1:5] == ["-m", "accelerate.commands.launch", "--config_file", "a.yaml"] and argv[-2:] == [
        "--config",
        str(path),
    ]
    sys.path.insert(0, str(project.root))
    try:
        module = __import__("studio_reward")
        info = _run(module.reward(sample_episode("Q", "ping", "<answer>ping</answer>")))
    finally:
        sys.path.remove(str(project.root))
        sys.modules.pop("studio_reward", None)
    assert info["reward"] == pytest.approx(1.0)
    assert load_project_reward(project.root) is not None
    assert yaml.safe_load(path.read_text())["logging"]["samples_per_step"] == 4


def test_start_lists_the_config_it_saved(project: Project, tabs: Tabs, tiny_model_dir: Path) -> None:
    """Start writes configs/<run>.yaml: the saved-configs dropdown offers it at once, not after a reload."""
    from rlf_studio.training import TrainForm

    assert project.configs() == []
    form = TrainForm(model=str(tiny_model_dir), run_name="fresh", max_total_tokens=2048)
    outputs = tabs.train.on_start(str(project.root), *form.values())
    assert outputs[0].startswith("**Done:** started run 'fresh'"), outputs[0]
    assert project.configs() == ["fresh"]
    assert outputs[-1] == {"__type__": "update", "choices": ["fresh"], "value": "fresh"}


def test_run_process_abort_stops_the_group(tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    code = (
        "import pathlib, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"pathlib.Path({str(child)!r}).write_text(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    run = RunProcess.start([sys.executable, "-c", code], tmp_path, {})
    deadline = time.monotonic() + 30
    while not child.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run.status() == "running"
    assert run.abort(grace_s=5) == "aborted"
    pid = int(child.read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in _proc_state(pid)  # the child went with it


def test_a_late_tick_never_repeats_the_end_over_newer_words(tmp_path: Path) -> None:
    """CI once saw Resume's refusal overwritten by a timer tick that still said 'aborted'."""
    import gradio as gr

    from rlf_studio.ui.common import Studio
    from rlf_studio.ui.tab_train import TrainTab

    studio = Studio(tmp_path / "projects")
    with gr.Blocks():
        tab = TrainTab(studio, gr.State(""))
    run_dir = tmp_path / "run"
    aborted = RunProcess.start([sys.executable, "-c", "import time; time.sleep(60)"], run_dir, {})
    studio.runs[str(run_dir)] = aborted
    assert tab.on_tick(str(run_dir), 2)[-2] == gr.skip()  # running: the status is left alone
    status, _, timer = tab.on_abort(str(run_dir), 2)
    assert "aborted" in status and timer.active is False
    assert tab.on_tick(str(run_dir), 2)[-2] == gr.skip()  # the abort's answer said the end already

    finished = RunProcess.start([sys.executable, "-c", "pass"], run_dir, {})
    studio.runs[str(run_dir)] = finished
    finished.wait(30)
    assert "finished" in tab.on_tick(str(run_dir), 2)[-2]  # the first tick after the end says it
    assert tab.on_tick(str(run_dir), 2)[-2] == gr.skip()  # and only that one


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


# --- runs ----------------------------------------------------------------------------------------


def test_runs_curves_and_rollouts(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": s / 2, "kl": 0.1}) + "\n" for s in (1, 2))
    )
    transcript = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "",
                  "tool_calls": [{"function": {"name": "sleep", "arguments": {"ms": 1}}}]}]  # fmt: skip
    samples = [{"step": 1, "group": 0, "prompt": "Q", "reward": 1.0, "transcript": transcript}] * 2
    (run / "train_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert metric_keys([run]) == ["reward/mean", "kl"]
    assert [r["value"] for r in curve_rows({"r": run}, ["reward/mean"])] == [0.5, 1.0]
    page = rollouts_html(run, 1)
    assert "zero variance" in page and "tool call: <b>sleep</b>" in page
    assert "No rollouts logged for step 9" in rollouts_html(run, 9)


# --- playground ----------------------------------------------------------------------------------


def test_playground_episode_and_model_turn(project: Project, openai_server) -> None:
    from rlf_studio.playground import EpisodeSession

    session = EpisodeSession(project, max_turns=3)
    try:
        assert "tools: sleep" in session.reset(0)
        word = session.question.split()[-1].rstrip(".")
        call = json.dumps({"name": "sleep", "arguments": {"ms": 1, "payload": word}})
        assert session.step(f"<tool_call>{call}</tool_call>").startswith("1 tool call(s), errors: none")
        titles = [m.get("metadata", {}).get("title", "") for m in session.chat()]
        assert any(t.startswith("tool result: sleep (ok") for t in titles)
        openai_server.reply = f"<answer>{word}</answer>"
        text = session.model_turn(openai_server.url, "m")
        assert "final reward **1.000**" in session.step(text)
        assert "step 1 of the 'playground' run" in session.save(project)
        assert "tool call: <b>sleep</b>" in rollouts_html(project.runs_dir / "playground", 1)
    finally:
        session.close()


# --- layering ------------------------------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_studio_is_a_layer_on_top() -> None:
    for package in ("rlf_envs", "envs_registry", "rlf_trainer", "rlf_serve", "rlf_bench"):
        for path in (REPO / package).rglob("*.py"):
            bad = {n for n in _imports(path) if n.split(".")[0] in ("rlf_studio", "gradio")}
            assert not bad, f"{path} imports {bad}"
    for path in (REPO / "rlf_studio").rglob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in ("rlf_bench", "envs_registry"), f"{path} imports {name}"
            if top in ("rlf_envs", "rlf_trainer", "rlf_serve"):
                private = [part for part in name.split(".") if part.startswith("_")]
                assert not private, f"{path} reaches into a private name: {name}"
        if "ui" not in path.relative_to(REPO / "rlf_studio").parts:
            assert "gradio" not in {n.split(".")[0] for n in _imports(path)}, f"{path} imports gradio"


def test_cli_help() -> None:
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "rlf_studio", "--help"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 0 and "--project-dir" in out.stdout


def test_endpoint_plays_and_scores_episodes(project: Project, openai_server) -> None:
    from rlf_studio.policy import chat_once, play_episodes

    openai_server.reply = "<answer>ping</answer>"
    rows, summary = play_episodes(project, openai_server.url, "m", split="train", limit=2, max_turns=2)
    assert [row[3] for row in rows] == [1.0, 0.0] and summary.endswith("mean reward 0.500")
    history = chat_once(
        openai_server.url, "m", [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "again"
    )
    assert [m["role"] for m in history] == ["user", "user", "assistant"] and history[0]["content"] == "hi"


def test_serving_needs_a_trained_model(tmp_path: Path) -> None:
    from rlf_studio.playground import PlaygroundError
    from rlf_studio.policy import serve_model

    with pytest.raises(PlaygroundError, match="holds no trained model"):
        serve_model(tmp_path / "model", tmp_path, 1, {})


def test_sql_execution_reward_on_the_bundled_database() -> None:
    from rlf_envs.tasks.sql.task import SQLTask

    gold = SQLTask(seed=0, isolation="guards").instances("test")[0].answer
    spec = {"components": [{"name": "sql", "weight": 1}], "sql": {"seed": 0}}
    rows, errors = preview(
        spec, [["Q", gold, f"<answer>{gold}</answer>"], ["Q", gold, "<answer>SELECT 1</answer>"]]
    )
    assert errors == [] and [r[3] for r in rows] == [1.0, 0.0]
