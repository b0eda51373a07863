"""Data tab: upload or point to a task file, map its fields, preview, split and save into the project.

A file that cannot be read empties the loaded rows: "Save into project" then says to load a file,
never saves the rows of an earlier file. The id column is the user's choice (guessed from the
usual names; "(row number)" numbers the rows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from rlf_studio.data import (
    columns,
    guess_id_column,
    guess_mapping,
    load_tasks,
    map_records,
    preview_rows,
    read_records,
    save_tasks,
    split_records,
)
from rlf_studio.ui.common import Studio, error, guarded, ok, status_box

ROW_NUMBER = "(row number)"  # the id choice that numbers the rows
# the rows table's headers when nothing is loaded: what a saved task holds (a table without
# columns would show Gradio's placeholder headers "1 2 3")
TASK_COLUMNS = ["id", "question", "answer"]


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame([], columns=TASK_COLUMNS)
    headers, data = preview_rows(rows)
    return pd.DataFrame(data, columns=headers)


def _loaded(file: str) -> tuple[Any, ...]:
    """The outputs after reading a file: message, rows, source name, column choices, table."""
    rows = read_records(file)
    cols = columns(rows)
    q, a = guess_mapping(cols)
    missing = "" if q else " No question column was recognised: pick one."
    return (
        ok(f"read {len(rows)} row(s) with columns: {', '.join(cols)}.{missing}"),
        rows,
        Path(file).name,
        gr.update(choices=cols, value=q or None),
        gr.update(choices=cols, value=a or None),
        gr.update(choices=[ROW_NUMBER, *cols], value=guess_id_column(cols) or ROW_NUMBER),
        _table(rows),
    )


def _rejected(message: str) -> tuple[Any, ...]:
    """The outputs after a file that cannot be read: the error, and nothing loaded any more."""
    empty = gr.update(choices=[], value=None)
    return error(message + " (nothing loaded)"), [], "", empty, empty, empty, _table([])


def _id_column(choice: str | None) -> str:
    return "" if not choice or choice == ROW_NUMBER else choice


LOADED = 7  # outputs of _loaded


class DataTab:
    """The tab's widgets (built in the page's current block) and its handlers."""

    def __init__(self, studio: Studio, project_state: gr.State) -> None:
        self.studio = studio
        gr.Markdown(
            "Tasks as JSONL, JSON or parquet (Search-R1 style `question` / `golden_answers` too). "
            "Map the columns to **question** and **answer**, preview, then save into the project."
        )
        self._widgets()
        self._wire(project_state)

    def _widgets(self) -> None:
        self.rows_state = gr.State([])
        self.source_state = gr.State("")
        with gr.Row():
            # no file_types filter: the browser would drop another file silently, keeping the last
            # one loaded; read_records names what is wrong with it instead
            self.upload = gr.File(label="Upload a task file (.jsonl, .json, .parquet)", elem_id="data-file",
                                  scale=2)  # fmt: skip
            with gr.Column(scale=2):
                self.path = gr.Textbox(label="...or a path on this machine", elem_id="data-path")
                self.load = gr.Button("Load path", elem_id="data-load")
        self.status = status_box("data-status")
        with gr.Row():
            # custom values allowed: a rejected file empties the choices, and a value left from the
            # file before must not fail the next event's preprocessing
            self.question = gr.Dropdown(
                [], label="question column", elem_id="data-question", allow_custom_value=True
            )
            self.answer = gr.Dropdown(
                [], label="answer column", elem_id="data-answer", allow_custom_value=True
            )
            self.task_id = gr.Dropdown([], label="id column", elem_id="data-id", allow_custom_value=True)
            self.fraction = gr.Number(
                0.25, label="test fraction", minimum=0, maximum=0.9, elem_id="data-test-fraction"
            )
            self.seed = gr.Number(0, label="split seed", precision=0, elem_id="data-seed")
        with gr.Row():
            self.preview = gr.Button("Preview mapping", elem_id="data-preview")
            self.save = gr.Button("Save into project", variant="primary", elem_id="data-save")
        self.table = gr.Dataframe(headers=TASK_COLUMNS, label="Rows", elem_id="data-table", wrap=True)

    def _wire(self, project_state: gr.State) -> None:
        loaded = [self.status, self.rows_state, self.source_state, self.question, self.answer, self.task_id,
                  self.table]  # fmt: skip
        # the upload box is emptied after each file, so the next file can be dropped right away
        self.upload.upload(self.on_upload, self.upload, loaded).then(lambda: None, None, self.upload)
        self.load.click(self.on_load, self.path, loaded)
        mapping = [self.rows_state, self.question, self.answer, self.task_id]
        self.preview.click(self.on_preview, mapping, [self.status, self.table])
        save_inputs = [project_state, *mapping, self.fraction, self.seed, self.source_state]
        self.save.click(self.on_save, save_inputs, [self.status, self.table])
        project_state.change(self.on_project, project_state, [self.status, self.table])

    def on_upload(self, file: Any) -> tuple[Any, ...]:
        if not file:
            return (gr.skip(),) * LOADED
        return self.read(file if isinstance(file, str) else file.name)

    def on_load(self, text: str) -> tuple[Any, ...]:
        file = Path((text or "").strip()).expanduser()
        if not file.is_file():
            return _rejected(f"no file at {str(file)!r}")
        return self.read(str(file))

    def read(self, file: str) -> tuple[Any, ...]:
        try:
            return _loaded(file)
        except Exception as exc:  # a bad file must not leave the previous file's rows to be saved
            return _rejected(str(exc) or type(exc).__name__)

    @guarded(2)
    def on_preview(self, rows: list[dict[str, Any]], q: str, a: str, task_id: str) -> tuple[Any, ...]:
        if not rows:
            raise ValueError("load a task file first")
        tasks = map_records(rows, q, a, _id_column(task_id))
        return ok(f"{len(tasks)} task(s) mapped; first rows below"), _table(tasks)

    @guarded(2)
    def on_save(self, path: str, rows: list[dict[str, Any]], q: str, a: str, task_id: str, fraction: float,
                seed: float, source: str) -> tuple[Any, ...]:  # fmt: skip
        project = self.studio.project(path)
        if not rows:
            raise ValueError("load a task file first: nothing is loaded")
        id_column = _id_column(task_id)
        tasks = map_records(rows, q, a, id_column)
        train, test = split_records(tasks, float(fraction or 0), int(seed or 0))
        mapping = {"file": source, "question": q, "answer": a, "id": id_column or None,
                   "test_fraction": fraction, "seed": seed}  # fmt: skip
        return ok(save_tasks(project, train, test, mapping)), _table(train)

    def on_project(self, path: str) -> tuple[Any, ...]:
        if not path:
            return "", _table([])
        tasks = load_tasks(self.studio.project(path))
        message = f"the project holds {len(tasks)} train task(s)" if tasks else "the project has no tasks yet"
        return message, _table(tasks)


def build(studio: Studio, project_state: gr.State) -> DataTab:
    return DataTab(studio, project_state)
