"""What the studio checks before and while a run goes: Start's refusals, the token budget, Abort, health.

Real envs (every env id the Train tab offers), the tiny Qwen3's real tokenizer and chat template,
real subprocesses for Abort; no page (tests/test_studio_browser.py drives that).
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import sys
import time
from pathlib import Path

import pytest

from rlf_studio.budget import BudgetError, check_budget, model_folder, schema_tokens
from rlf_studio.data import DataError, map_records, read_records
from rlf_studio.project import Project, ProjectError, check_name, create_project
from rlf_studio.rewards import RewardSpecError, load_python_reward
from rlf_studio.run_health import health_words, pace_words, tripped_checks
from rlf_studio.runner import RunProcess, state_label
from rlf_studio.tools import add_bundled, connect
from rlf_studio.training import (
    ENV_CHOICES,
    PROJECT_ENV,
    SFT,
    SIMULATED_ENV,
    TrainConfigError,
    TrainForm,
    check_config,
    config_dict,
    load_form,
    save_config,
    start_problems,
)
from rlf_trainer.observe.health import HINTS, HealthLog, HealthReport, Trip
from tests.studio_fixtures.page import Tabs

# --- Start's refusals ----------------------------------------------------------------------------


def test_start_refuses_what_cannot_train(project: Project, tabs: Tabs) -> None:
    """One rule in one wording per field, whichever button meets it: Preview once said the config
    loader's `max_steps must be >= 0` for -1, and Start then refused 0 with "at least 1"."""
    path = str(project.root)
    for field, value, rule in [
        ("max_steps", -1, "steps must be at least 1 (got -1)"),
        ("max_steps", 0, "steps must be at least 1 (got 0)"),
        ("group_size", 0, "group size must be at least 2"),
        ("group_size", 1, "group size must be at least 2"),
    ]:
        values = dataclasses.replace(TrainForm(), **{field: value}).values()
        assert rule in tabs.train.on_preview(path, *values)[0]
        assert rule in tabs.train.on_save(path, *values)[0]
        started = tabs.train.on_start(path, *values)[0]
        assert rule in started and "no run started" in started
    assert not project.runs_dir.joinpath("run1").exists() and project.configs() == []

    from rlf_studio.training import form_problems

    assert form_problems(TrainForm()) == [] and start_problems(TrainForm()) == []
    problems = form_problems(TrainForm(max_steps=0, group_size=1))
    assert [p.split(" must")[0] for p in problems] == ["steps", "group size"]
    assert "GRPO-style losses compare the samples of one prompt" in problems[1]


def test_the_config_loader_refuses_no_turns(tmp_path: Path) -> None:
    form = TrainForm(max_turns=0, env_id="RLF/Codebook-v0")
    with pytest.raises(TrainConfigError, match=r"rollout.max_turns must be >= 1"):
        check_config(config_dict(create_project(tmp_path, "t"), form))


def test_model_folder_that_does_not_exist(tmp_path: Path, tiny_model_dir: Path) -> None:
    with pytest.raises(BudgetError, match="the model folder '/no/such/model' does not exist"):
        model_folder("/no/such/model")
    with pytest.raises(BudgetError, match="holds no config.json"):
        model_folder(str(tmp_path))
    assert model_folder("Org/some-model") is None  # a hub id: the trainer downloads it
    assert model_folder(str(tiny_model_dir)) == tiny_model_dir


def test_names_say_what_they_name(tmp_path: Path) -> None:
    with pytest.raises(ProjectError, match="a run name may hold letters"):
        check_name("my run", "run")
    with pytest.raises(ProjectError, match="a run name may hold"):
        config_dict(create_project(tmp_path, "q"), TrainForm(run_name="my run", env_id="RLF/Codebook-v0"))
    with pytest.raises(RewardSpecError, match="the reward file '/no/such/reward.py' does not exist"):
        load_python_reward("/no/such/reward.py", "reward")
    (tmp_path / "r.txt").write_text("x")
    with pytest.raises(RewardSpecError, match="is not a .py file"):
        load_python_reward(tmp_path / "r.txt", "reward")


# --- any env, and the token budget ---------------------------------------------------------------


@pytest.mark.parametrize("env_id", [e for e in ENV_CHOICES if e != PROJECT_ENV])
def test_every_offered_env_makes_a_valid_config_and_fits_its_budget(
    env_id: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    project = create_project(tmp_path, "bare")  # bundled envs need no project tasks
    form = TrainForm(model=str(tiny_model_dir), env_id=env_id, max_total_tokens=4096)
    data = check_config(config_dict(project, form))
    assert data["env"]["id"] == env_id
    report = check_budget(form.model, data)
    assert report is not None and report.problem() == ""
    assert report.num_tools >= 1 and 0 < report.tool_tokens < report.prompt_tokens
    saved = save_config(project, data)
    assert load_form(project, saved.stem).env_id == env_id


def test_customer_service_takes_a_simulator_endpoint(tmp_path: Path) -> None:
    project = create_project(tmp_path, "cs")
    form = TrainForm(env_id=SIMULATED_ENV, sim_base_url="http://127.0.0.1:8000/v1", sim_model="sim")
    data = check_config(config_dict(project, form))
    assert data["env"]["kwargs"] == {
        "user_simulator": {"base_url": "http://127.0.0.1:8000/v1", "model": "sim"}
    }
    save_config(project, data)
    loaded = load_form(project, form.run_name)
    assert (loaded.sim_base_url, loaded.sim_model) == ("http://127.0.0.1:8000/v1", "sim")
    with pytest.raises(TrainConfigError, match="needs both an endpoint URL and a model name"):
        config_dict(project, TrainForm(env_id=SIMULATED_ENV, sim_base_url="http://127.0.0.1:8000/v1"))


def test_sft_stage_makes_an_sft_config(tmp_path: Path) -> None:
    project = create_project(tmp_path, "s")
    form = TrainForm(env_id="RLF/Codebook-v0", loss=SFT, group_size=1, sft_data="demos.jsonl")
    data = check_config(config_dict(project, form))
    demos = project.root / "demos.jsonl"  # a relative path is the project's
    assert data["algorithm"]["name"] == "sft" and data["sft"] == {"data": str(demos)}
    assert start_problems(form, data) == [
        f"the SFT data file {str(demos)!r} does not exist (rlf-collect writes one, docs/sft.md)"
    ]
    demos.write_text("")
    assert start_problems(form, data) == []  # a group of one is fine for SFT
    save_config(project, data)
    loaded = load_form(project, form.run_name)
    assert (loaded.loss, loaded.sft_data, loaded.group_size) == (SFT, str(demos), 1)
    with pytest.raises(TrainConfigError, match="algorithm.name=sft needs sft.data"):
        check_config(config_dict(project, TrainForm(env_id="RLF/Codebook-v0", loss=SFT)))


def test_prompt_over_the_budget_is_refused_with_its_numbers(project: Project, tiny_model_dir: Path) -> None:
    form = TrainForm(model=str(tiny_model_dir), max_new_tokens=16, max_total_tokens=64)
    data = check_config(config_dict(project, form))
    report = check_budget(form.model, data)
    assert report is not None and report.num_tools >= 2  # the latency server: sleep, stats, ...
    assert report.prompt_tokens > 64 and report.tool_tokens > 0
    problem = report.problem()
    assert problem.startswith(f"the longest train prompt takes {report.prompt_tokens} tokens")
    hint = re.search(r"raise it to at least (\d+),", problem)
    assert hint, problem
    needed = int(hint.group(1))
    for budget, fits in [(report.prompt_tokens + 16, False), (needed - 1, False), (needed, True)]:
        data["rollout"]["max_total_tokens"] = budget  # the hint's number is the first that starts
        checked = check_budget(form.model, data)
        assert checked is not None and (checked.problem() == "") == fits, (budget, checked.problem())
    # the whole episode: the prompt, 2 turns of 16 tokens and one tool result between them, 256
    # tokens (docs/studio.md) while no tool has been called
    assert needed == report.needed == report.prompt_tokens + 2 * 16 + 256
    assert "1 tool result of 256 tokens (an estimate: call a tool in the Tools or Playground tab" in problem
    assert "left for the episode, which may add" in checked.words()
    data["rollout"]["max_turns"] = 1  # one turn: no tool result to read before the answer
    assert check_budget(form.model, data).needed == report.prompt_tokens + 16


def test_start_makes_room_for_the_longest_tool_result_seen(
    project: Project, tabs: Tabs, tiny_model_dir: Path
) -> None:
    """A budget that holds the prompt and a turn cut every episode before it read a tool result: Start
    asks for room for the longest result the person has seen (Tools tab, Playground), and no less."""
    path = str(project.root)
    form = TrainForm(model=str(tiny_model_dir), max_new_tokens=16, max_total_tokens=64)

    def needed_by_start() -> int:
        refusal = tabs.train.on_start(path, *form.values())[0]
        assert "no run started" in refusal, refusal
        assert "the longest result seen in the Tools or Playground tab" in refusal, refusal
        return int(re.search(r"raise it to at least (\d+),", refusal).group(1))

    assert tabs.tools.on_connect(path, project.mcp_path.read_text())[0].startswith("**Done:** connected")
    status, result = tabs.tools.on_call(path, "sleep", json.dumps({"ms": 1, "payload": "tool output " * 40}))
    assert status.startswith("**Done:** **ok**")
    from_tools = needed_by_start()
    data = check_config(config_dict(project, form))
    measured = check_budget(form.model, data, tool_result=result)
    assert measured is not None and from_tools == measured.needed
    assert measured.result_measured

    assert tabs.playground.on_reset(path, 0, 3)[0].startswith("**Done:** episode started")
    call = {"name": "sleep", "arguments": {"ms": 1, "payload": "a longer tool output " * 40}}
    assert "1 tool call(s)" in tabs.playground.on_send(path, f"<tool_call>{json.dumps(call)}</tool_call>")[0]
    needed = needed_by_start()
    assert needed > from_tools  # the Playground's longer result

    form = dataclasses.replace(form, max_total_tokens=needed - 1)
    assert f"is {needed - 1}: raise it to at least {needed}," in tabs.train.on_start(path, *form.values())[0]
    form = dataclasses.replace(form, max_total_tokens=needed)
    started = tabs.train.on_start(path, *form.values())[0]
    assert started.startswith("**Done:** started run 'run1'") and "left for the episode" in started


def test_a_short_model_context_caps_the_budget(
    project: Project, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The trainer's rule: the limit is the smaller of the episode budget and the model's context."""
    short = tmp_path / "short-context"
    short.mkdir()
    for path in tiny_model_dir.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors"):
            (short / path.name).write_bytes(path.read_bytes())
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 64}))
    data = check_config(config_dict(project, TrainForm(model=str(short), max_total_tokens=4096)))
    report = check_budget(str(short), data)
    assert report is not None and report.budget.limit == 64
    assert "but the model's context is 64 tokens" in report.problem()


def test_schema_tokens_are_what_the_tools_add(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    session, message = connect(add_bundled("{}", "latency")[0])
    assert session is not None, message
    try:
        tools = [s.to_openai() for s in session.specs()]
    finally:
        session.close()
    one, both = schema_tokens(tokenizer, tools[:1]), schema_tokens(tokenizer, tools)
    assert schema_tokens(tokenizer, []) == 0 and 0 < one < both


# --- Abort ---------------------------------------------------------------------------------------

# a "trainer" that logs a step every 0.2 s and starts a child, with SIGINT ignored as under `rlf-studio &`
STEPPER = """
import pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
{extra}
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"])
pathlib.Path("child.pid").write_text(str(child.pid))
step = 0
while True:
    step += 1
    with open("steps.txt", "a") as f:
        f.write(f"{{step}}\\n")
    time.sleep(0.2)
"""


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return True
    return "zombie" in state


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "ignores_sigterm", [False, True], ids=["sigint-ignored", "sigint-and-sigterm-ignored"]
)
def test_abort_stops_the_group_whatever_the_signal_mask(tmp_path: Path, ignores_sigterm: bool) -> None:
    extra = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignores_sigterm else ""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a studio started with `&` from a script
    try:
        run = RunProcess.start([sys.executable, "-c", STEPPER.format(extra=extra)], tmp_path, {})
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 60
    while not (tmp_path / "steps.txt").exists() or not (tmp_path / "child.pid").exists():
        assert time.monotonic() < deadline and run.running, run.log_tail()
        time.sleep(0.05)
    assert run.abort(grace_s=1.0) == "aborted" and state_label(run.status()) == "Aborted"
    assert run.process.poll() is not None  # Abort returned after the trainer had exited: no step after it
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)  # the whole process group went
    assert run.abort() == "aborted"  # a second Abort changes nothing


def test_abort_of_a_finished_run_is_no_error(tmp_path: Path) -> None:
    run = RunProcess.start([sys.executable, "-c", "print('done')"], tmp_path, {})
    assert run.wait(60) == 0
    assert run.abort() == "finished" and state_label(run.status()) == "Done" and not run.aborted


# --- health and pace -----------------------------------------------------------------------------


def test_tripped_checks_are_read_defensively(tmp_path: Path) -> None:
    assert tripped_checks(tmp_path) == [] and health_words([]) == ""
    lines = [
        {
            "step": 5,
            "check": "entropy_collapse",
            "message": "entropy 0.01 < 0.05",
            "hint": "raise rollout.temperature",
        },
        {"step": 2, "check": "over_budget", "message": "prompt 3030 tokens of 1024", "hint": ""},
        {"step": 6, "check": "entropy_collapse", "message": "again", "hint": "x"},
        {"check": ""},
        ["not", "an", "object"],
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines) + '{"step": 7, "check": "cut'
    (tmp_path / "health.jsonl").write_text(text)
    checks = tripped_checks(tmp_path)
    assert [(c.step, c.check) for c in checks] == [(2, "over_budget"), (5, "entropy_collapse")]
    assert health_words(checks) == (
        "over_budget (step 2): prompt 3030 tokens of 1024.; "
        "entropy_collapse (step 5): entropy 0.01 < 0.05. Try: raise rollout.temperature"
    )
    assert pace_words(30, 0, 4) == "elapsed 30s, ETA: after the first step"
    assert pace_words(90, 3, 4) == "elapsed 1m 30s, ETA 30s"


def test_the_trainers_health_log_reads_back(tmp_path: Path) -> None:
    """What the trainer's own HealthLog writes is what the studio reads."""
    trip = Trip(
        step=3,
        check="no_learning_signal",
        message="every group had one reward",
        hint=HINTS["no_learning_signal"],
    )
    HealthLog(tmp_path, [], echo=lambda line: None).write(HealthReport(flags={}, trips=[trip], new=[trip]))
    assert tripped_checks(tmp_path) == [trip]


# --- data ----------------------------------------------------------------------------------------


def test_id_column_is_the_users_choice(tmp_path: Path) -> None:
    rows = [{"qid": "a", "q": "x?", "a": 1}, {"qid": "b", "q": "y?", "a": 2}]
    assert [t["id"] for t in map_records(rows, "q", "a", "qid")] == ["a", "b"]
    assert [t["id"] for t in map_records(rows, "q", "a")] == ["0", "1"]
    with pytest.raises(DataError, match="rows 1 and 2 share the id 'a'"):
        map_records([{"qid": "a", "q": "x?", "a": 1}, {"qid": "a", "q": "y?", "a": 2}], "q", "a", "qid")
    with pytest.raises(DataError, match="no id column 'nope'"):
        map_records(rows, "q", "a", "nope")
    (tmp_path / "tasks.csv").write_text("q,a\nx,1\n")
    with pytest.raises(DataError, match="tasks.csv is not a task file: use .jsonl, .json, .parquet"):
        read_records(tmp_path / "tasks.csv")


# --- the docs' python reward ---------------------------------------------------------------------


def test_the_documented_python_reward_runs_on_a_real_episode(project: Project) -> None:
    """docs/studio.md's reward example, fed a real episode of the project's env (one failed call)."""
    from rlf_studio.playground import EpisodeSession

    project.write_json(
        project.reward_path,
        {"components": [{"name": "python", "weight": 1.0}],
         "python": {"file": str(Path(__file__).parent / "studio_fixtures" / "example_reward.py"), "function": "reward"}},
    )  # fmt: skip
    session = EpisodeSession(project, max_turns=3)
    try:
        session.reset(0)
        word = session.question.split()[-1].rstrip(".")
        session.step('<tool_call>{"name": "sleep", "arguments": {"ms": "soon"}}</tool_call>')
        assert "final reward **0.900**" in session.step(f"<answer>{word}</answer>")
        assert session.reward_info["failed_calls"] == 1
    finally:
        session.close()
