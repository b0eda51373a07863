"""What a run prints while it trains: a rich bar on a terminal, one line a step elsewhere.

Example:
    >>> progress_line(3, 12, {"reward/mean": 0.5, "time/step": 41.96, "eval/reward": 1.0})
    'GRPO step 3/12  reward 0.500  eval 1.000  42.0 s/step  ~6.3 min to go'
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any


def progress_line(step: int, max_steps: int, metrics: dict[str, float]) -> str:
    """The line a step prints when stdout is not a terminal.

    Example:
        >>> progress_line(3, 12, {"reward/mean": 0.5, "time/step": 41.96, "eval/reward": 1.0})
        'GRPO step 3/12  reward 0.500  eval 1.000  42.0 s/step  ~6.3 min to go'
        >>> progress_line(1, 30, {"sft/loss": 1.25})
        'SFT step 1/30  loss 1.250'
    """
    if "sft/loss" in metrics:  # algorithm.name: sft
        parts = [f"SFT step {step}/{max_steps}", f"loss {metrics['sft/loss']:.3f}"]
    else:
        parts = [f"GRPO step {step}/{max_steps}", f"reward {metrics.get('reward/mean', float('nan')):.3f}"]
    if "eval/reward" in metrics:
        parts.append(f"eval {metrics['eval/reward']:.3f}")
    if "time/step" in metrics:
        left_s = metrics["time/step"] * (max_steps - step)
        parts.append(f"{metrics['time/step']:.1f} s/step  ~{left_s / 60:.1f} min to go")
    return "  ".join(parts)


def flat_hparams(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as TensorBoard hparams: dotted keys, scalars kept, anything else as text."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_hparams(value, f"{name}."))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
        else:
            out[name] = str(value)
    return out


@contextlib.contextmanager
def step_printer(
    stage: str, max_steps: int, done: int, current_step: Callable[[], int], *, enabled: bool = True
) -> Iterator[Callable[[dict[str, float]], None]]:
    """Yields ``advance(metrics)``, called after each step. A rich bar on a terminal; one line a step
    otherwise (logs, pipes, CI), so no run is silent. ``enabled`` False (other processes,
    ``logging.progress_bar: false``) prints nothing."""
    if not enabled:
        yield lambda metrics: None
        return
    if not sys.stdout.isatty():
        print(f"{stage}: {max_steps - done} steps to go, a line after each", flush=True)
        yield lambda metrics: print(progress_line(current_step(), max_steps, metrics), flush=True)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (
        TextColumn(f"[bold]{stage}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns) as progress:
        task = progress.add_task("", total=max_steps, completed=done)

        def advance(metrics: dict[str, float]) -> None:
            line = progress_line(current_step(), max_steps, metrics)
            progress.update(task, completed=current_step(), description=line.split("  ", 1)[-1])

        yield advance


__all__ = ["flat_hparams", "progress_line", "step_printer"]
