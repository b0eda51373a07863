"""What a run prints while it trains (a rich bar on a terminal, one line a step elsewhere) or evaluates.

Example:
    >>> progress_line(3, 12, {"reward/mean": 0.5, "time/step": 41.96, "eval/reward": 1.0})
    'GRPO step 3/12  reward 0.500  eval 1.000  42.0 s/step  ~6.3 min to go'
"""

from __future__ import annotations

import contextlib
import sys
import time
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


def episodes_line(label: str, done: int, total: int, elapsed_s: float) -> str:
    """The progress line of an evaluation when stderr is not a terminal, with the time to go.

    Example:
        >>> episodes_line("rlf-eval", 16, 64, elapsed_s=12.0)
        'rlf-eval 16/64 episodes  12 s  ~36 s to go'
        >>> episodes_line("rlf-eval", 10, 40, elapsed_s=300.0)
        'rlf-eval 10/40 episodes  5.0 min  ~15.0 min to go'
    """
    left_s = elapsed_s / done * (total - done) if done else float("nan")
    return f"{label} {done}/{total} episodes  {_duration(elapsed_s)}  ~{_duration(left_s)} to go"


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


@contextlib.contextmanager
def episode_progress(label: str, total: int, *, enabled: bool = True) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n)``, called as ``n`` more episodes finish; everything goes to stderr (stdout
    stays for results). A rich bar with the time to go on a terminal; otherwise about one line
    (:func:`episodes_line`) per tenth of the episodes. ``enabled`` False prints nothing."""
    if not enabled or total <= 0:
        yield lambda n: None
        return
    started = time.perf_counter()
    if not sys.stderr.isatty():
        state = {"done": 0, "next": 0}

        def advance_line(n: int) -> None:
            state["done"] += n
            if state["done"] >= state["next"] or state["done"] == total:
                state["next"] = state["done"] + max(1, total // 10)
                print(episodes_line(label, state["done"], total, time.perf_counter() - started),
                      file=sys.stderr, flush=True)  # fmt: skip

        yield advance_line
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("", total=total)
        yield lambda n: progress.update(task, advance=n)


__all__ = ["episode_progress", "episodes_line", "flat_hparams", "progress_line", "step_printer"]
