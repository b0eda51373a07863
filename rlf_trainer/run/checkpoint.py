"""Exact resume: checkpoints around ``accelerator.save_state``.

Everything random in a training step is a pure function of ``(seed, step)``: which prompts are
drawn (:class:`~rlf_trainer.prompts.PromptSampler`) and every sampling seed
(:func:`~rlf_trainer.seeds.sample_seed`). A checkpoint therefore needs only what Accelerate saves
(model, optimizer, scheduler, RNG states of every process) plus a small ``trainer_state.json``
(step, sampler state, seed, metric history). A run resumed from step ``k`` draws the same prompts
and samples for step ``k+1`` as a run that never stopped.

Layout: ``<checkpoint dir>/step_00000012/`` holds Accelerate's files and ``trainer_state.json``,
written last (a folder without it is an interrupted save and is ignored).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_path(directory: str | os.PathLike[str], step: int) -> Path:
    return Path(directory) / f"step_{step:08d}"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest first."""
    root = Path(directory)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    checkpoints = list_checkpoints(directory)
    return checkpoints[-1] if checkpoints else None


def resolve_resume(resume: str, directory: str | os.PathLike[str]) -> Path | None:
    """``"auto"`` -> the latest complete checkpoint in ``directory`` (or None), ``"none"`` -> None, else a path."""
    if resume in ("none", "", "false", "False"):
        return None
    if resume == "auto":
        return latest_checkpoint(directory)
    path = Path(os.path.expanduser(resume))
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"checkpoint.resume={resume!r}: no {STATE_FILE} in {path}")
    return path


def write_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write ``trainer_state.json`` atomically; its presence marks the checkpoint complete."""
    target = Path(path) / STATE_FILE
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, target)


def read_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())


def prune_checkpoints(directory: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (0 keeps all); returns the deleted."""
    if keep_last <= 0:
        return []
    old = list_checkpoints(directory)[:-keep_last]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old
