"""Where a run's metrics go besides metrics.jsonl: ``logging.report_to``, any of Accelerate's trackers.

``report_to`` names Accelerate trackers (``tensorboard``, ``wandb``, ``mlflow``, ``trackio``,
``comet_ml``, ``aim``, ``clearml``, ``dvclive``, ``swanlab``, or ``all`` for every one installed),
as TRL's ``report_to`` and verl's ``trainer.logger`` do; ``[]`` logs to none. The names are checked
before the run builds anything (:func:`check_report_to`): Accelerate itself skips a tracker whose
package is missing with a debug message, so a misspelt or uninstalled tracker would otherwise log
nothing, silently.

Every tracker logs the run under ``logging.project`` (wandb's and trackio's project, mlflow's
experiment) with ``logging.run_name`` as the run's name; TensorBoard keeps writing to
``<run dir>/tensorboard``. ``logging.tracker_kwargs`` adds keyword arguments per tracker (e.g.
``{wandb: {entity: my-team}}``), passed to Accelerate's ``init_trackers``.

Example:
    >>> check_report_to(["tensorboard", "wandbb"])
    Traceback (most recent call last):
    ...
    rlf_trainer.config.ConfigError: logging.report_to names 'wandbb', which is not one of Accelerate's trackers (did you mean 'wandb'?): aim, all, clearml, comet_ml, dvclive, mlflow, swanlab, tensorboard, trackio, wandb
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlf_trainer.config import ConfigError
from rlf_trainer.config_sections import LoggingConfig

TENSORBOARD_DIR = "tensorboard"  # <run dir>/tensorboard, whatever logging.project says

# The keyword that names the run in each tracker's init (Accelerate passes the project positionally).
_RUN_NAME_KEY = {"wandb": "name", "trackio": "name", "mlflow": "run_name"}


def builtin_trackers() -> list[str]:
    """Accelerate's own tracker names (``LoggerType``), ``all`` included."""
    from accelerate.utils import LoggerType

    return sorted(str(t) for t in LoggerType)


def accelerate_trackers() -> list[str]:
    """The tracker names Accelerate knows: its own and any registered with ``register_tracker_class``."""
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    return sorted({*builtin_trackers(), *LOGGER_TYPE_TO_CLASS})


def installed_trackers() -> list[str]:
    """The trackers whose package is importable here (Accelerate's own test of each)."""
    from accelerate.tracking import get_available_trackers

    return sorted(str(t) for t in get_available_trackers())


def check_report_to(names: Sequence[str]) -> None:
    """Raise :class:`ConfigError` for a name Accelerate does not know or whose package is not installed."""
    known = accelerate_trackers()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else " (use [] to log to none)"
            raise ConfigError(
                f"logging.report_to names {name!r}, which is not one of Accelerate's trackers{hint}: "
                + ", ".join(known)
            )
    installed = installed_trackers()
    # a registered custom tracker is its own package's to test for, and `all` takes what is there
    testable = set(builtin_trackers()) - {"all"}
    missing = [n for n in dict.fromkeys(names) if n in testable and n not in installed]
    if missing:
        raise ConfigError(
            f"logging.report_to names {', '.join(missing)}, but {'it is' if len(missing) == 1 else 'they are'} "
            f"not installed here: pip install {' '.join(missing)} (or remove "
            f"{'it' if len(missing) == 1 else 'them'} from logging.report_to; installed: "
            f"{', '.join(installed) or 'none'})"
        )


def trackers(logging: LoggingConfig, run_dir: Path, first_step: int = 0) -> list[Any]:
    """The ``log_with`` of the run's ``Accelerator``, after :func:`check_report_to`.

    TensorBoard is handed over as a tracker object of ours, so that its events stay in
    ``<run dir>/tensorboard`` while ``logging.project`` names the other trackers' project (Accelerate
    puts a TensorBoard tracker it builds in ``<logging dir>/<project>``). After a resume
    (``first_step`` > 0) it hides the events a stopped run logged past its checkpoint (``purge_step``).
    """
    check_report_to(logging.report_to)
    names = installed_trackers() if "all" in logging.report_to else list(dict.fromkeys(logging.report_to))
    out: list[Any] = [name for name in names if name != "tensorboard"]
    if "tensorboard" in names:
        from accelerate.tracking import TensorBoardTracker

        kwargs = dict(logging.tracker_kwargs.get("tensorboard", {}))
        if first_step:
            kwargs.setdefault("purge_step", first_step + 1)
        out.insert(0, TensorBoardTracker(TENSORBOARD_DIR, str(run_dir), **kwargs))
    return out


def init_kwargs(logging: LoggingConfig, run_dir: Path) -> dict[str, dict[str, Any]]:
    """``init_trackers``' per-tracker keyword arguments: the run's name (wandb also writes under the
    run folder), then ``logging.tracker_kwargs`` on top."""
    out: dict[str, dict[str, Any]] = {name: {key: logging.run_name} for name, key in _RUN_NAME_KEY.items()}
    out["wandb"]["dir"] = str(run_dir)
    for name, extra in logging.tracker_kwargs.items():
        out[name] = out.get(name, {}) | dict(extra)
    return {name: kwargs for name, kwargs in out.items() if name != "tensorboard"}
