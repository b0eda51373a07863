"""RLF Studio in a real headless Chromium, driven as a new user would: no Python written.

One studio process and one browser page serve the whole module; the tests run in file order and
each picks up where the previous one left the page (a project, then its servers, tasks, reward,
an episode, a training run and its curves), the way a person goes through the tabs. Each test
also feeds the tab a bad input and checks the message, and the page is reloaded on the way to
check that nothing a person typed or opened is lost. Every tab's screenshot lands in a temporary
folder, or in ``$RLF_STUDIO_SCREENSHOTS`` (``docs/studio`` refreshes the ones docs/studio.md shows).
The last test checks the browser console for the warnings the plots used to print.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.studio_fixtures.browser import (
    FIXTURES,
    TRAIN_TIMEOUT_MS,
    Page,
    chromium_path,
    screenshot_dir,
    studio_server,
)

pytest.importorskip("gradio")
pytest.importorskip("playwright")

pytestmark = pytest.mark.timeout(600)
FORM_KEY = "rlf-studio-train-form"  # rlf_studio.ui.app: the Train form's local-storage entry


@pytest.fixture(scope="module")
def project_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("studio") / "projects"


@pytest.fixture(scope="module")
def ui(project_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    with studio_server(project_dir) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        page = Page(browser.new_page(viewport={"width": 1280, "height": 900}),
                    screenshot_dir(tmp_path_factory.mktemp("screenshots")))  # fmt: skip
        page.open(url)
        yield page
        browser.close()


@pytest.fixture(scope="module")
def project(project_dir: Path) -> Path:
    return project_dir / "demo"


def test_create_project_and_reload(ui: Page, project: Path) -> None:
    ui.fill("project-name", "../oops")
    ui.click("project-create")
    ui.sees("project-status", "a project name may hold letters")
    ui.fill("project-name", "demo")
    ui.click("project-create")
    ui.sees("project-status", "created project 'demo'")
    ui.sees("current-project", str(project))
    assert (project / "project.json").is_file()
    ui.click("project-create")  # the name of a project that exists: it is reopened, not created
    ui.sees("project-status", "reopened the existing project 'demo'")
    # a fresh page lists the projects that exist now, and a reload keeps the open project
    ui.wait_stored("rlf-studio-project", None)  # rlf_studio.ui.app keeps the open project there
    ui.reload()
    ui.sees("current-project", str(project))
    ui.sees("project-status", "reopened project 'demo'")
    assert "demo" in ui.options("project-list")


def test_tools_bundled_server_and_playground(ui: Page, project: Path) -> None:
    ui.tab("Tools")
    # the reload's project change loads the project's mcp.json into the editor after the page is up:
    # text typed before it lands would be overwritten (the last handler of that change fills this)
    ui.sees("tools-tokens", "Connect the servers")
    ui.fill("mcp-json", '{"mcpServers": {"x": {"command": "python",}}}')
    ui.click("mcp-validate")
    ui.sees("tools-status", "Invalid JSON")
    ui.fill("mcp-json", '{"mcpServers": {"broken": {"command": "/nonexistent/rlf-no-such-server"}}}')
    ui.click("mcp-connect")
    ui.sees("tools-status", "Server failed to start")
    ui.click("mcp-save")  # the command Connect just reported missing is not saved either
    ui.sees("tools-status", "the command '/nonexistent/rlf-no-such-server' does not exist (nothing saved)")
    assert not (project / "mcp.json").exists()

    ui.fill("mcp-json", '{"mcpServers": {}}')
    ui.click("add-latency")
    ui.has_value("mcp-json", "rlf_envs.servers.latency")
    ui.click("mcp-save")
    ui.sees("tools-status", "saved mcp.json")
    ui.click("mcp-connect")
    ui.sees("tools-status", "connected")
    ui.sees("tools-table", "sleep")
    ui.sees("tools-tokens", "tool schema(s) take", timeout_ms=TRAIN_TIMEOUT_MS)  # loads a tokenizer
    ui.sees("tools-tokens", "count against *tokens per episode*".replace("*", ""))
    ui.pick("tool-name", "sleep")
    ui.fill("tool-args", '{"ms": 5, "payload": "hello studio"}')
    ui.click("tool-call")
    ui.sees("tool-call-status", "ok")
    ui.has_value("tool-result", "hello studio")
    ui.screenshot("tools")

    ui.fill("tool-args", '{"ms": "soon"}')
    ui.click("tool-call")
    ui.sees("tool-call-status", "bad_arguments")
    ui.fill("tool-args", '{"ms": 5, "payload": "second call"}')
    ui.click("tool-call")
    ui.has_value("tool-result", "second call")
    ui.fill("tool-args", "{not json")
    ui.click("tool-call")
    ui.sees("tool-call-status", "Invalid arguments JSON")
    ui.expect(ui.page.locator("#tool-result textarea")).to_have_value("")  # no stale result
    ui.fill("mcp-json", "{not json")
    ui.click("mcp-save")
    ui.sees("tools-status", "nothing saved")
    saved = json.loads((project / "mcp.json").read_text())
    assert "latency" in saved["mcpServers"]  # the bad save lost nothing


def test_tools_stay_after_a_reload_and_a_failed_connect(ui: Page, project: Path) -> None:
    """The servers run in the studio, not in the page: a reload shows their tools again, and a
    Connect that fails keeps the tools of the last one that worked."""
    ui.reload()
    ui.sees("current-project", str(project))
    ui.tab("Tools")
    ui.sees("tools-table", "sleep")
    ui.has_value("tool-name", "sleep")
    ui.sees("tools-tokens", "tool schema(s) take", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.click("tool-call")
    ui.sees("tool-call-status", "ok")

    ui.fill("mcp-json", '{"mcpServers": {"broken": {"command": "/nonexistent/rlf-no-such-server"}}}')
    ui.click("mcp-connect")
    ui.sees("tools-status", "Server failed to start")
    ui.sees("tools-status", "the tools listed are still those of the last Connect")
    ui.sees("tools-table", "sleep")
    ui.sees("tools-tokens", "tool schema(s) take")
    ui.fill("tool-args", '{"ms": 1, "payload": "still connected"}')
    ui.click("tool-call")
    ui.has_value("tool-result", "still connected")


def test_data_upload_map_and_save(ui: Page, project: Path) -> None:
    ui.tab("Data")
    ui.upload("data-file", FIXTURES / "no_question.jsonl")
    ui.sees("data-status", "No question column was recognised")
    ui.click("data-preview")
    ui.sees("data-status", "pick the question column; the file's columns are: label, text")

    # a rejected file leaves nothing loaded: Save must not save the previous file's rows
    ui.upload("data-file", FIXTURES / "tasks.csv")
    ui.sees("data-status", "tasks.csv is not a task file")
    ui.sees("data-table", "question")  # an empty table of tasks, not placeholder headers "1 2 3"
    ui.lacks("data-table", "label")  # the rejected file's rows are gone
    ui.click("data-save")
    ui.sees("data-status", "load a task file first")
    assert not (project / "tasks" / "train.jsonl").exists()

    ui.upload("data-file", FIXTURES / "tasks.jsonl")
    ui.sees("data-status", "read 4 row(s)")
    ui.pick("data-id", "(row number)")
    ui.pick("data-id", "qid")  # the file's own id column (also the guess)
    ui.click("data-preview")
    ui.sees("data-status", "4 task(s) mapped")
    ui.click("data-save")
    ui.sees("data-status", "saved 3 train and 1 test task(s)")
    ui.screenshot("data")
    train = [json.loads(line) for line in (project / "tasks" / "train.jsonl").read_text().splitlines()]
    assert len(train) == 3 and all(isinstance(t["answer"], list) for t in train)
    assert {t["id"] for t in train} < {"t0", "t1", "t2", "t3"}


def test_reward_compose_preview_and_bad_file(ui: Page, project: Path) -> None:
    ui.tab("Reward")
    ui.check("reward-names", "format")
    ui.fill("reward-weight-exact_match", "0.9")
    ui.fill("reward-weight-format", "0.1")
    ui.click("reward-preview")
    ui.sees("reward-preview-status", "scored 3 sample(s)")
    ui.sees("reward-results", "0.1")
    ui.click("reward-save")
    ui.sees("reward-status", "saved reward.json: 0.9 exact_match + 0.1 format")
    ui.screenshot("reward")

    ui.check("reward-names", "python")
    ui.fill("reward-file", str(FIXTURES / "no_such_reward.py"))
    ui.click("reward-preview")
    ui.sees("reward-preview-status", "no_such_reward.py' does not exist")
    ui.fill("reward-file", str(FIXTURES / "raising_reward.py"))
    ui.click("reward-preview")
    ui.sees("reward-preview-status", "the reward raised ZeroDivisionError")
    ui.click("reward-save")
    ui.sees("reward-status", "nothing saved")
    spec = json.loads((project / "reward.json").read_text())
    assert [c["name"] for c in spec["components"]] == ["exact_match", "format"]
    ui.check("reward-names", "python")  # untick: the page matches the saved reward again


def test_playground_episode_by_typing(ui: Page) -> None:
    ui.tab("Playground")
    ui.click("play-send")
    ui.sees("play-status", "press New episode first")
    ui.click("play-reset")
    ui.sees("play-status", "episode started on task 0")
    word = re.search(r"Echo the word (\w+)", ui.text("play-chat")).group(1)
    call = {"name": "sleep", "arguments": {"ms": 1, "payload": word}}
    ui.fill("play-action", f"<tool_call>{json.dumps(call)}</tool_call>")
    ui.click("play-send")
    ui.sees("play-status", "1 tool call(s), errors: none")
    ui.sees("play-chat", "tool result: sleep (ok")
    ui.fill("play-action", f"It echoes <answer>{word}</answer>")
    ui.click("play-send")
    ui.sees("play-status", "final reward 1.000")
    ui.screenshot("playground")
    ui.click("play-save")
    ui.sees("play-status", "saved as step 1 of the 'playground' run")


def _train_form(ui: Page, model: Path, run: str, steps: int) -> None:
    ui.fill("train-model", str(model))
    ui.fill("train-run", run)
    ui.fill("train-steps", str(steps))
    ui.fill("train-new-tokens", "32")
    ui.fill("train-lr", "0.001")


def _refused(ui: Page, elem_id: str, value: str, message: str, good: str) -> None:
    """Start with one bad field: the message, and no run started; then the field back to ``good``."""
    ui.fill(elem_id, value)
    ui.click("train-start")
    ui.sees("train-status", message, timeout_ms=TRAIN_TIMEOUT_MS)
    ui.sees("train-status", "no run started")
    if good:
        ui.fill(elem_id, good)


def test_train_form_checks_and_survives_a_reload(
    ui: Page, project: Path, tool_calling_model_dir: Path
) -> None:
    ui.tab("Train")
    # the tiny model fitted to call `sleep`: a random one never writes a tool call to show in Runs
    _train_form(ui, tool_calling_model_dir, "tiny", -1)
    ui.click("train-preview")
    ui.sees("train-status", "steps must be at least 1 (got -1)")  # Start's rule and words for 0 too
    ui.fill("train-run", "my run")
    ui.click("train-preview")
    ui.sees("train-status", "a run name may hold letters")
    ui.fill("train-run", "tiny")
    ui.fill("train-steps", "2")
    ui.click("train-preview")
    ui.sees("train-status", "the config is valid")
    ui.has_value("train-command", "train.py --config")
    ui.click("train-save")
    ui.sees("train-status", "saved")

    # the YAML panel follows the form, never shows an older config
    ui.page.get_by_text("config YAML (follows the form)").click()
    ui.sees("train-config-yaml", "max_steps: 2")
    ui.fill("train-steps", "5")
    ui.sees("train-config-yaml", "max_steps: 5")
    ui.fill("train-steps", "2")
    ui.sees("train-config-yaml", "max_steps: 2")

    _refused(ui, "train-steps", "0", "steps must be at least 1", "2")
    _refused(ui, "train-turns", "0", "rollout.max_turns must be >= 1", "2")  # the config loader's own
    _refused(ui, "train-group", "1", "group size must be at least 2", "2")
    _refused(ui, "train-model", "/no/such/model", "the model folder '/no/such/model' does not exist",
             str(tool_calling_model_dir))  # fmt: skip
    _refused(ui, "train-total-tokens", "48", "the longest train prompt takes", "")
    assert not (project / "runs" / "tiny").exists()

    saved = ui.stored(FORM_KEY)
    ui.fill("train-total-tokens", "1024")
    ui.click("train-preview")  # a round trip after the change: its save has been answered too
    ui.sees("train-status", "the config is valid")
    ui.wait_stored(FORM_KEY, saved)  # the browser has stored the form's last change
    ui.reload()  # the open project and the form's values stay
    ui.sees("current-project", str(project))
    ui.tab("Train")
    ui.has_value("train-model", str(tool_calling_model_dir))
    ui.has_value("train-run", "tiny")
    ui.has_value("train-new-tokens", "32")
    ui.has_value("train-total-tokens", "1024")


def test_train_abort_start_finish_resume(ui: Page, project: Path) -> None:
    ui.click("train-start")
    ui.sees("train-status", "started run 'tiny'", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.sees("train-status", "left for the episode")  # the budget's numbers
    ui.sees("train-progress", "elapsed")
    ui.click("train-abort")
    ui.sees("train-status", "Stopped: run 'tiny' aborted")
    ui.sees("train-progress", "Aborted: step")
    ui.lacks("train-progress", "Running")
    ui.click("train-resume")
    ui.sees("train-status", "no checkpoint to resume from")
    ui.click("train-start")
    ui.sees("train-status", "started run 'tiny'", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.sees("train-status", "run 'tiny' finished", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.sees("train-progress", "Done: step 2/2, took")
    ui.screenshot("train")
    ui.click("train-abort")  # the run has ended: nothing to abort, and no error
    ui.sees("train-status", "run 'tiny' had already ended (Done): nothing to abort")
    ui.lacks("train-status", "Error")
    ui.click("train-start")
    ui.sees("train-status", "already exists: press Resume")

    # the trainer's health checks (docs/trainer.md) write health.jsonl; the progress says them in words
    trip = {"step": 2, "check": "no_learning_signal", "message": "every group had one reward",
            "hint": "raise algorithm.group_size"}  # fmt: skip
    (project / "runs" / "tiny" / "health.jsonl").write_text(json.dumps(trip) + "\n")
    ui.fill("train-steps", "3")
    ui.click("train-resume")
    ui.sees("train-status", "resumed run 'tiny'", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.sees("train-status", "run 'tiny' finished", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.sees("train-progress", "Done: step 3/3")
    ui.sees(
        "train-health",
        "no_learning_signal (step 2): every group had one reward. Try: raise algorithm.group_size",
    )
    steps = [
        json.loads(line)["step"]
        for line in (project / "runs" / "tiny" / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3]


def test_train_other_envs(ui: Page) -> None:
    ui.page.get_by_text("config YAML (follows the form)").click()  # closed again by the reload
    ui.pick("train-env", "RLF/Codebook-v0")
    ui.fill("train-run", "codebook")
    ui.click("train-preview")
    ui.sees("train-status", "the config is valid")
    ui.sees("train-config-yaml", "id: RLF/Codebook-v0")
    ui.pick("train-loss", "sft")  # the trainer's SFT stage (docs/sft.md)
    ui.click("train-preview")
    ui.sees("train-status", "algorithm.name=sft needs sft.data")
    ui.fill("train-sft-data", "demos.jsonl")
    ui.sees("train-config-yaml", "name: sft")
    ui.click("train-start")
    ui.sees("train-status", "demos.jsonl' does not exist")
    ui.sees("train-status", "no run started")
    ui.fill("train-sft-data", "")
    ui.pick("train-loss", "grpo")
    ui.pick("train-env", "RLF/CustomerService-v0")
    ui.fill("train-sim-url", "http://127.0.0.1:9/v1")
    ui.click("train-preview")
    ui.sees("train-status", "needs both an endpoint URL and a model name")
    ui.fill("train-sim-model", "customer")
    ui.click("train-preview")
    ui.sees("train-config-yaml", "base_url: http://127.0.0.1:9/v1")
    ui.fill("train-sim-url", "")
    ui.fill("train-sim-model", "")
    ui.pick("train-env", "RLF/ToolUse-v0")
    ui.fill("train-run", "tiny")


def test_runs_curves_and_rollouts(ui: Page) -> None:
    ui.tab("Runs")  # opening the tab lists the runs as they are now: no Refresh needed
    ui.sees("runs-status", "2 run(s) in demo")
    ui.sees("runs-summary", "no_learning_signal (step 2)")
    ui.pick("runs-metrics", "response_length")
    ui.click("runs-show")
    ui.sees("runs-status", "in 2 panel(s), one per metric")
    assert ui.visible("runs-curve-0") and ui.visible("runs-curve-1") and not ui.visible("runs-curve-2")
    ui.sees("runs-curve-1", "response_length")
    ui.click("rollout-show")
    ui.sees("rollout-html", "step 1: 4 episode(s) in 2 group(s)")  # the tiny run: G=2 x 2 prompts
    ui.sees("rollout-html", "tool call: sleep")  # the run's own episodes called the tool
    ui.screenshot("runs-training")
    ui.pick("rollout-run", "playground")
    ui.sees("runs-status", "playground")
    ui.click("rollout-show")
    ui.sees("rollout-html", "tool call: sleep")
    ui.sees("rollout-html", "tool result (sleep)")
    ui.screenshot("runs")

    ui.pick("rollout-run", "tiny")
    ui.sees("runs-status", "tiny: rollouts logged for 3 step(s)")
    ui.click("serve-start")
    ui.sees("serve-status", "serving 'tiny' at http://127.0.0.1:", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.fill("eval-n", "1")
    ui.click("eval-run")
    ui.sees("serve-status", "1 test episode(s) played by 'tiny': mean reward", timeout_ms=TRAIN_TIMEOUT_MS)
    ui.fill("chat-input", "hello")
    ui.click("chat-send")
    ui.sees("serve-status", "answered")
    ui.screenshot("runs-model")
    ui.click("serve-stop")
    ui.sees("serve-status", "model server aborted")
    ui.tab("Projects")
    ui.fill("project-name", "demo")
    ui.click("project-open")
    ui.sees("project-summary", "2 run(s)")
    ui.screenshot("projects")


def test_no_plot_warnings_in_the_console(ui: Page) -> None:
    plots = [line for line in ui.console if re.search(r"vega|plot|scale|infinite extent", line, re.I)]
    assert plots == [], plots
