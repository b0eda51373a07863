"""Several training processes: start the process group right, refuse a wrong launch, end every rank on a failure.

:func:`make_accelerator` is how the trainer gets its ``Accelerator``:

- under ``torchrun`` / ``accelerate launch`` on a machine without a GPU it asks for the CPU
  explicitly, so the workers join one gloo process group (Accelerate otherwise sees no device
  and makes each worker a one-process run: every worker acts as rank 0 and writes the same files);
- ``distributed.timeout_s`` becomes the process group's timeout (a collective that a peer never
  joins raises after it instead of blocking forever);
- a launch that asked for several processes but got one process group of one stops at start
  with a :class:`LaunchError` that says how to launch.

:class:`~rlf_trainer.run.rank_watch.RankWatch` (started by :func:`make_accelerator` when there are
several processes) ends every rank when one fails, with a message naming the failed rank and its
error; :func:`explain_failure` is what the training loop raises.

Example:
    >>> launch_problem({"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "29500"}) is not None
    True
    >>> launch_problem({"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "29500"}) is None
    True
    >>> launched_world_size({"WORLD_SIZE": "4"})
    4
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

from rlf_trainer.run.rank_watch import RankFailure, RankWatch

logger = logging.getLogger(__name__)

HOW_TO_LAUNCH = (
    "launch several processes with `torchrun --standalone --nproc_per_node 2 examples/train.py --config ...` "
    "or `accelerate launch --config_file examples/configs/accelerate/multi_cpu.yaml examples/train.py "
    "--config ...` (on GPUs: examples/configs/accelerate/*.yaml); see docs/trainer.md"
)
_WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


class LaunchError(RuntimeError):
    """The processes were started in a way the trainer cannot run as one job."""


def launched_world_size(environ: Mapping[str, str] | None = None) -> int:
    """The number of processes the launcher says the job has (1 when none says)."""
    env = os.environ if environ is None else environ
    for name in _WORLD_SIZE_VARS:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return 1


def launch_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this environment cannot be a correct launch, or None.

    ``accelerate launch --cpu --num_processes N`` (and a ``distributed_type: MULTI_CPU`` config)
    starts several CPU processes only through mpirun; without it Accelerate (1.16) starts ONE
    process and gives it ``MASTER_PORT`` but no ``WORLD_SIZE``: that signature is refused.
    """
    env = os.environ if environ is None else environ
    accelerate_cpu = env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    if accelerate_cpu and "MASTER_PORT" in env and launched_world_size(env) == 1 and "RANK" not in env:
        return (
            "`accelerate launch --cpu` (or a MULTI_CPU Accelerate config) was asked for several processes "
            "but started only this one: Accelerate starts several CPU processes only through mpirun. "
            + HOW_TO_LAUNCH
        )
    return None


def ignored_sharding(distributed_type: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the launch's FSDP / DeepSpeed request was silently dropped, or None.

    Accelerate (1.16) turns ``ACCELERATE_USE_FSDP`` into FSDP only on GPU-like devices and starts
    DeepSpeed only off the CPU; on the CPU both runs would quietly be plain data parallel.

    Example:
        >>> ignored_sharding("MULTI_CPU", {"ACCELERATE_USE_FSDP": "true"}).split(":")[0]
        'the launch asked for FSDP but Accelerate made a MULTI_CPU run'
        >>> ignored_sharding("FSDP", {"ACCELERATE_USE_FSDP": "true"}) is None
        True
    """
    env = os.environ if environ is None else environ
    for variable, wanted in (("ACCELERATE_USE_FSDP", "FSDP"), ("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED")):
        if env.get(variable, "").lower() == "true" and distributed_type != wanted:
            return (
                f"the launch asked for {wanted} but Accelerate made a {distributed_type} run: it enables "
                f"{wanted} only on GPU-like devices (not on the CPU / gloo), so the model would not be "
                "sharded. Use examples/configs/accelerate/multi_cpu.yaml on the CPU (DDP); see docs/trainer.md"
            )
    return None


def resume_note(saved_processes: int | None, processes: int) -> str | None:
    """What changes when a checkpoint written by ``saved_processes`` resumes on ``processes`` (None: nothing).

    Example:
        >>> resume_note(2, 2) is None
        True
        >>> resume_note(2, 1).split(":")[0]
        'resuming a checkpoint written by 2 processes on 1 process'
    """
    if saved_processes is None or saved_processes == processes:
        return None
    return (
        f"resuming a checkpoint written by {saved_processes} processes on {processes} "
        f"process{'es' if processes > 1 else ''}: the model, optimizer and prompt stream continue "
        "exactly, but the prompts are split over the processes differently and sampled with other "
        f"seeds, so the next steps differ from a run that stayed on {saved_processes}"
    )


def _has_accelerator_device() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def make_accelerator(timeout_s: float, **accelerator_kwargs: Any) -> Any:
    """An ``Accelerator`` whose process group is the whole launch, with ``timeout_s`` as its timeout.

    Raises :class:`LaunchError` when the launch asked for several processes and the process
    group has one. With several processes a :class:`RankWatch` is started (``accelerator.rank_watch``
    in :func:`rank_watch_of`).
    """
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    problem = launch_problem()
    if problem:
        raise LaunchError(problem)
    world = launched_world_size()
    cpu = world > 1 and not _has_accelerator_device()
    handlers = list(accelerator_kwargs.pop("kwargs_handlers", []))
    handlers.append(InitProcessGroupKwargs(timeout=timedelta(seconds=timeout_s)))
    accelerator = Accelerator(cpu=cpu, kwargs_handlers=handlers, **accelerator_kwargs)
    if world > 1 and accelerator.num_processes != world:
        raise LaunchError(
            f"the launcher started {world} processes (WORLD_SIZE={world}) but this process group has "
            f"{accelerator.num_processes}: every process would train alone and write the same files. "
            + HOW_TO_LAUNCH
        )
    ignored = ignored_sharding(accelerator.distributed_type.value)
    if ignored:
        raise LaunchError(ignored)
    if accelerator.num_processes > 1:
        watch = RankWatch.from_process_group(timeout_s)
        watch.start()
        _WATCHES[id(accelerator)] = watch
    return accelerator


_WATCHES: dict[int, RankWatch] = {}


def rank_watch_of(accelerator: Any) -> RankWatch | None:
    """The :class:`RankWatch` :func:`make_accelerator` started for ``accelerator`` (None for one process)."""
    return _WATCHES.get(id(accelerator))


def explain_failure(accelerator: Any, exc: BaseException) -> BaseException:
    """The exception a failed training loop should raise: ``exc``, or a :class:`RankFailure` naming the rank
    that caused it. Reports ``exc`` to the other ranks first (they stop within a second or two).

    Call it from the ``except`` of the training loop, before the cleanup that tears down the
    process group: ``except BaseException as exc: raise explain_failure(acc, exc)``.
    """
    watch = rank_watch_of(accelerator)
    return exc if watch is None else watch.explain(exc)


def stop_rank_watch(accelerator: Any) -> None:
    """Stop the heartbeat of a rank that finished normally (called when the trainer closes)."""
    watch = _WATCHES.pop(id(accelerator), None)
    if watch is not None:
        watch.stop()


def any_rank(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` is true on any process (a collective: every process must call it equally often)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    value = torch.tensor([1.0 if flag else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(value, reduction="sum").item() > 0)


__all__ = [
    "HOW_TO_LAUNCH",
    "any_rank",
    "LaunchError",
    "RankFailure",
    "RankWatch",
    "explain_failure",
    "ignored_sharding",
    "launch_problem",
    "launched_world_size",
    "make_accelerator",
    "rank_watch_of",
    "resume_note",
    "stop_rank_watch",
]


def mean_over_processes(accelerator: Any, metrics: dict[str, float]) -> dict[str, float]:
    """Each metric's mean over the processes that have it (every process gets the same dict)."""
    if accelerator.num_processes == 1:
        return metrics
    from accelerate.utils import gather_object

    gathered: list[dict[str, float]] = gather_object([metrics])
    keys = sorted({k for m in gathered for k in m})
    return {k: sum(m[k] for m in gathered if k in m) / sum(1 for m in gathered if k in m) for k in keys}


@contextlib.contextmanager
def full_parameters(accelerator: Any, model: Any) -> Iterator[None]:
    """Sharded (ZeRO-3 / FSDP) parameters gathered for the duration; a no-op otherwise."""
    kind = accelerator.distributed_type.value
    if kind == "DEEPSPEED" and accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            yield
    elif kind == "FSDP":
        from torch.distributed.fsdp import FullyShardedDataParallel

        with FullyShardedDataParallel.summon_full_params(model, writeback=False):
            yield
    else:
        yield
