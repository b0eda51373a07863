"""Exact resume: a stateless prompt sampler, step seeds, and checkpoints around ``accelerator.save_state``.

Everything random in a training step is a pure function of ``(seed, step)``: which prompts are
drawn (:class:`PromptSampler`) and the generation seed (:func:`step_seed`). A checkpoint therefore
needs only what Accelerate saves (model, optimizer, scheduler, RNG states of every process) plus a
small ``trainer_state.json`` (step, sampler state, seeds, metric history). A run resumed from step
``k`` draws the same prompts and samples for step ``k+1`` as a run that never stopped.

Layout: ``<checkpoint dir>/step_00000012/`` holds Accelerate's files and ``trainer_state.json``,
written last (a folder without it is an interrupted save and is ignored).

Example:
    >>> sampler = PromptSampler(num_tasks=5, seed=0)
    >>> sorted(sampler.indices(step=0, count=5))   # one epoch: every prompt once
    [0, 1, 2, 3, 4]
    >>> sampler.indices(step=3, count=2) == PromptSampler(num_tasks=5, seed=0).indices(step=3, count=2)
    True
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_UNKNOWN_SIZE = 2**31 - 1  # the env wraps an index around its split's size


def step_seed(seed: int, step: int, *salt: int) -> int:
    """A 63-bit seed derived from ``(seed, step, *salt)``: independent streams per step (and rank, turn)."""
    return int(
        np.random.SeedSequence([seed, step, *salt]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1)
    )


@dataclass(frozen=True)
class PromptSampler:
    """Which train prompts step ``k`` uses: epoch-wise shuffled when ``num_tasks`` is known.

    The stream is a pure function of ``seed``: position ``p`` (the ``p``-th prompt drawn in the run)
    is element ``p % num_tasks`` of the permutation of epoch ``p // num_tasks``. With an unknown
    size, prompts are drawn with replacement from a large range (the env wraps it to its split).
    """

    num_tasks: int | None
    seed: int

    def at(self, position: int) -> int:
        if self.num_tasks is None:
            return int(np.random.default_rng([self.seed, position]).integers(_UNKNOWN_SIZE))
        epoch, offset = divmod(position, self.num_tasks)
        return int(np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)[offset])

    def indices(self, step: int, count: int) -> list[int]:
        """The ``count`` prompt indices of 0-based step ``step`` (positions ``step*count ...``)."""
        start = step * count
        if self.num_tasks is None:
            return [self.at(p) for p in range(start, start + count)]
        out: list[int] = []
        position = start
        while len(out) < count:  # one permutation per epoch touched, not one per prompt
            epoch, offset = divmod(position, self.num_tasks)
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_tasks)
            take = min(count - len(out), self.num_tasks - offset)
            out.extend(int(i) for i in perm[offset : offset + take])
            position += take
        return out

    def refill_indices(self, step: int, round_: int, count: int) -> list[int]:
        """Extra prompts for DAPO's refill round ``round_`` (1, 2, ...) of step ``step``.

        A stream of its own, a pure function of ``(seed, step, round_)``: however many rounds a
        step needed, the main stream (and so :meth:`state`) is the same, and a resumed run refills
        a step exactly as the original run did.

        Example:
            >>> s = PromptSampler(num_tasks=10, seed=0)
            >>> s.refill_indices(3, 1, 4) == s.refill_indices(3, 1, 4) != s.refill_indices(3, 2, 4)
            True
        """
        stream = PromptSampler(self.num_tasks, step_seed(self.seed, step, 0x5EF111, round_))
        return stream.indices(0, count)

    def state(self, step: int, count: int) -> dict[str, Any]:
        """The JSON-friendly data position after ``step`` steps of ``count`` prompts."""
        position = step * count
        epoch = None if self.num_tasks is None else position // self.num_tasks
        return {"seed": self.seed, "num_tasks": self.num_tasks, "position": position, "epoch": epoch}


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
