"""Tools tab: edit the ``mcpServers`` JSON, add bundled servers, connect, and call tools by hand.

After Connect the tab says how many prompt tokens the connected tools' schemas take under a
model's chat template: every episode's prompt carries them, so they count against the Train tab's
"tokens per episode" (``rollout.max_total_tokens``).

The servers run server-side (:attr:`Studio.tool_sessions`) and outlive the page: opening a project,
or reloading the page, shows the tools of its running session. A Connect that fails keeps the
servers (and the tools listed) of the last Connect that worked.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr
import pandas as pd

from rlf_studio.budget import BudgetError, load_tokenizer, schema_tokens
from rlf_studio.tools import (
    BUNDLED_SERVERS,
    ToolSession,
    add_bundled,
    check_mcp_json,
    connect,
    example_arguments,
    missing_commands,
    parse_json_object,
    tools_table,
)
from rlf_studio.ui.common import Studio, error, guarded, ok, status_box

EMPTY_CONFIG = '{\n  "mcpServers": {}\n}\n'
TOOL_COLUMNS = ["tool", "description", "parameters (JSON schema)"]


def _dump(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=2) + "\n"


def _tool_list(session: ToolSession | None) -> tuple[pd.DataFrame, Any]:
    """The tools table and the tool picker's choices (the first picked) for ``session``'s tools."""
    specs = session.specs() if session is not None else []
    names = [s.name for s in specs]
    rows = pd.DataFrame(tools_table(specs), columns=TOOL_COLUMNS)
    return rows, gr.update(choices=names, value=names[0] if names else None)


def _adder(name: str) -> Any:
    """The handler of a bundled server's button: the editor's config plus that server."""

    @guarded(2, 1)
    def add(text: str) -> tuple[str, str]:
        config, message = add_bundled(text, name)
        return _dump(config), ok(message + ": Save, then Connect")

    return add


class ToolsTab:
    """The tab's widgets (built in the page's current block) and its handlers."""

    def __init__(self, studio: Studio, project_state: gr.State) -> None:
        self.studio = studio
        gr.Markdown(
            "The Claude-Desktop / Cursor `mcpServers` JSON: a stdio `command` + `args` or a streamable-HTTP "
            "`url` per server, plus RLF's `timeout_s`, `max_concurrency`, `replicas`, `cache`. "
            "**Connect** starts them through the env's own pool."
        )
        self._editor()
        self._playground()
        self._wire(project_state)

    def _editor(self) -> None:
        self.editor = gr.Textbox(EMPTY_CONFIG, label="mcp.json", lines=14, max_lines=40, elem_id="mcp-json",
                                 elem_classes=["rlf-mono"])  # fmt: skip
        with gr.Row():
            self.add_buttons = {
                b: gr.Button(f"+ {b} server", size="sm", elem_id=f"add-{b}") for b in BUNDLED_SERVERS
            }
        with gr.Row():
            self.validate = gr.Button("Validate", elem_id="mcp-validate")
            self.save = gr.Button("Save", elem_id="mcp-save")
            self.connect = gr.Button("Connect", variant="primary", elem_id="mcp-connect")
        self.status = status_box("tools-status")
        with gr.Row():
            self.token_model = gr.Textbox("tiny-qwen3", label="count schema tokens with the chat template of "
                                          "(a folder, a hub id, tiny-qwen3, smollm2-135m)", scale=3,
                                          elem_id="tools-token-model")  # fmt: skip
            self.count = gr.Button("Count tokens", elem_id="tools-token-count", scale=1)
        self.tokens = gr.Markdown("", elem_id="tools-tokens")
        self.table = gr.Dataframe(headers=TOOL_COLUMNS, label="Tools", elem_id="tools-table", wrap=True)

    def _playground(self) -> None:
        gr.Markdown("### Tool playground")
        with gr.Row():
            self.tool = gr.Dropdown([], label="Tool", elem_id="tool-name", scale=1)
            self.args = gr.Textbox("{}", label="Arguments (JSON)", lines=3, elem_id="tool-args", scale=3)
        self.call = gr.Button("Call tool", variant="primary", elem_id="tool-call")
        self.call_status = status_box("tool-call-status")
        self.result = gr.Textbox(label="Result", lines=6, interactive=False, elem_id="tool-result")

    def _wire(self, project_state: gr.State) -> None:
        for name, button in self.add_buttons.items():
            button.click(_adder(name), self.editor, [self.editor, self.status])
        self.validate.click(self.on_validate, self.editor, self.status)
        self.save.click(self.on_save, [project_state, self.editor], self.status)
        counted = [project_state, self.token_model]
        self.connect.click(
            self.on_connect, [project_state, self.editor], [self.status, self.table, self.tool]
        ).then(self.on_count, counted, self.tokens)
        self.count.click(self.on_count, counted, self.tokens)
        self.token_model.submit(self.on_count, counted, self.tokens)
        self.tool.change(self.on_pick, [project_state, self.tool], self.args)
        self.call.click(self.on_call, [project_state, self.tool, self.args], [self.call_status, self.result])
        # a reload or another project: the editor and the tools of the project's running servers
        project_state.change(self.on_project, project_state, [self.editor, self.table, self.tool]).then(
            self.on_count, counted, self.tokens
        )

    @staticmethod
    def checked(text: str) -> tuple[dict[str, Any] | None, str]:
        """Validate's and Save's verdict: the env's loader, then every stdio command can be found
        (a command Connect reports missing is never saved)."""
        config, message = check_mcp_json(text)
        if config is None:
            return None, message
        missing = missing_commands(config)
        return (None, "; ".join(missing)) if missing else (config, message)

    @guarded(1)
    def on_validate(self, text: str) -> str:
        config, message = self.checked(text)
        return ok(message) if config is not None else error(message)

    @guarded(1)
    def on_save(self, path: str, text: str) -> str:
        project = self.studio.project(path)
        config, message = self.checked(text)
        if config is None:
            return error(message + " (nothing saved)")
        project.write_text(project.mcp_path, _dump(config))
        return ok(f"saved {project.mcp_path.name}: {message}")

    @guarded(3)
    def on_connect(self, path: str, text: str) -> tuple[Any, ...]:
        project = self.studio.project(path)
        config, message = check_mcp_json(text)
        if config is None:
            return error(message), gr.skip(), gr.skip()
        # the new servers start before the old ones stop: a failed Connect keeps the last good tools
        session, why = connect(config)
        if session is None:
            kept = self.studio.tool_sessions.get(str(project.root))
            still = "; the tools listed are still those of the last Connect" if kept is not None else ""
            return error(why + still), gr.skip(), gr.skip()
        self.studio.replace_tools(str(project.root), session)
        rows, choices = _tool_list(session)
        names = [s.name for s in session.specs()]
        return ok(f"connected: {len(names)} tool(s): {', '.join(names)}"), rows, choices

    @guarded(1)
    def on_count(self, path: str, model: str) -> str:
        if not path:
            return ""
        session = self.studio.tool_sessions.get(str(self.studio.project(path).root))
        if session is None:
            return "Connect the servers to count their schemas' tokens."
        tools = [s.to_openai() for s in session.specs()]
        try:
            tokenizer = load_tokenizer(model)
        except BudgetError as exc:
            return error(str(exc))
        if tokenizer is None:
            return error(f"the tokenizer of {model!r} is not on this machine: give a model folder")
        count = schema_tokens(tokenizer, tools)
        return (
            f"**{len(tools)} tool schema(s) take {count} prompt tokens** with {model.strip()}'s chat "
            "template: every episode's prompt carries them, so they count against *tokens per episode* "
            "(Train tab, `rollout.max_total_tokens`)."
        )

    def on_pick(self, path: str, name: str) -> str:
        session = self.studio.tool_sessions.get(path or "")
        spec = next((s for s in session.specs() if s.name == name), None) if session else None
        return example_arguments(spec) if spec else "{}"

    def on_call(self, path: str, name: str, text: str) -> tuple[str, str]:
        """A call's status and result; a call that never ran empties the Result box (no stale result)."""
        try:
            return self.call_tool(path, name, text)
        except Exception as exc:
            return error(str(exc) or type(exc).__name__), ""

    def call_tool(self, path: str, name: str, text: str) -> tuple[str, str]:
        session = self.studio.tool_sessions.get(str(self.studio.project(path).root))
        if session is None:
            return error("no servers running: press Connect first"), ""
        if not name:
            return error("pick a tool"), ""
        outcome = session.call(name, parse_json_object(text, "arguments JSON"))
        self.studio.saw_tool_result(path, outcome.text)  # Start's budget makes room for results this long
        if outcome.ok:
            return ok(outcome.markdown()), outcome.text
        return error(f"{outcome.error_kind} after {outcome.latency_ms:.1f} ms"), outcome.text

    def on_project(self, path: str) -> tuple[Any, ...]:
        """The project's mcp.json, and the tools of its servers when they are running (after a reload)."""
        project = self.studio.project(path) if path else None
        if project is None:
            return (EMPTY_CONFIG, *_tool_list(None))
        text = project.mcp_path.read_text(encoding="utf-8") if project.mcp_path.is_file() else EMPTY_CONFIG
        return (text, *_tool_list(self.studio.tool_sessions.get(str(project.root))))


def build(studio: Studio, project_state: gr.State) -> ToolsTab:
    return ToolsTab(studio, project_state)
