"""Several training processes: start the process group right, refuse a wrong launch, end every rank on a failure.

:func:`make_accelerator` is how the trainer gets its ``Accelerator``:

- under ``torchrun`` / ``accelerate launch`` on a machine without a GPU it asks for the CPU
  explicitly, so the workers join one gloo process group (Accelerate otherwise sees no device
  and makes each worker a one-process run: every worker acts as rank 0 and writes the same files);
- ``distributed.timeout_s`` becomes the process group's timeout (a collective that a peer never
  joins raises after it instead of blocking forever);
- a launch that asked for several processes but got one process group of one stops at start
  with a :class:`LaunchError` that says how to launch.

:class:`RankWatch` (started by :func:`make_accelerator` when there are several processes) ends
every rank when one fails. Each rank beats a heart counter in the process group's key-value
store once a second; a rank whose training raises writes its error there before it exits. A
watcher thread on every rank stops its own rank (with a message naming the failed rank and its
error) as soon as a peer's error appears or a peer's heart has not beaten for ``timeout_s``
(killed, or its machine gone). The watcher is needed because a rank blocked in a collective
cannot notice anything by itself until the process group's timeout: gloo raises at once only
when the peer's socket closes.

Example:
    >>> launch_problem({"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "29500"}) is not None
    True
    >>> launch_problem({"WORLD_SIZE": "2", "RANK": "1", "MASTER_PORT": "29500"}) is None
    True
    >>> launched_world_size({"WORLD_SIZE": "4"})
    4
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

logger = logging.getLogger(__name__)

HOW_TO_LAUNCH = (
    "launch several processes with `torchrun --standalone --nproc_per_node 2 examples/train.py --config ...` "
    "or `accelerate launch --config_file examples/configs/accelerate/multi_cpu.yaml examples/train.py "
    "--config ...` (on GPUs: examples/configs/accelerate/*.yaml); see docs/trainer.md"
)
_WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_KEY_PREFIX = "rlf-rank-watch/"
_ERROR_TEXT_LIMIT = 2000


class LaunchError(RuntimeError):
    """The processes were started in a way the trainer cannot run as one job."""


class RankFailure(RuntimeError):
    """Another rank failed (or stopped answering); this rank stops too. ``failed_rank`` is that rank."""

    def __init__(self, message: str, failed_rank: int | None) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank


class _StopRequested(BaseException):
    """Raised in the main thread by the watcher or by SIGTERM (the launcher stopping this rank)."""


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


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text[:_ERROR_TEXT_LIMIT]


def _is_collective_error(exc: BaseException) -> bool:
    """A failure of the process group itself (a peer's socket closed, a collective timed out)."""
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", ())
    if backend_error and isinstance(exc, backend_error):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("gloo", "connection closed by peer", "connection reset", "timed out")
    )


class RankWatch:
    """Heartbeats and failure notices of the ranks of one launch, through the process group's store.

    Keys (under ``rlf-rank-watch/``): ``beat/<rank>`` (a counter each rank adds 1 to every
    ``interval_s``) and ``failed/<rank>`` (the error of a rank whose training raised).
    """

    def __init__(
        self, store: Any, rank: int, world_size: int, timeout_s: float, interval_s: float = 1.0
    ) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        self.timeout_s, self.interval_s = timeout_s, interval_s
        self.stop_reason: RankFailure | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._beats: dict[int, tuple[int, float]] = {}

    @classmethod
    def from_process_group(cls, timeout_s: float) -> RankWatch:
        import torch.distributed as dist

        # The store every rank already reaches (the launcher's or rank 0's TCPStore); private API, but
        # it is what torch's own elastic agent and barrier use.
        store = dist.PrefixStore(_KEY_PREFIX, dist.distributed_c10d._get_default_store())
        return cls(store, dist.get_rank(), dist.get_world_size(), timeout_s)

    # ------------------------------------------------------------------------------ the watcher thread
    def start(self) -> None:
        self.store.add(f"beat/{self.rank}", 1)
        self._thread = threading.Thread(target=self._run, name="rlf-rank-watch", daemon=True)
        self._thread.start()
        if threading.current_thread() is threading.main_thread():
            # The launcher stops the surviving ranks with SIGTERM when one exits: turn it into an
            # exception, so the trainer closes its tool servers and says why it stopped.
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def stop(self) -> None:
        """This rank finished normally: stop beating and tell the peers not to wait for its heart."""
        self._stopped.set()
        try:
            self.store.set(f"done/{self.rank}", "1")
        except Exception:  # rank 0 / the launcher already went away with the store: nobody is left to tell
            logger.debug("could not mark rank %d done", self.rank, exc_info=True)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.stop_reason is None:
            failed = self.failed_peer()
            reason = f"; rank {failed[0]} failed: {failed[1]}" if failed else ""
            self.stop_reason = RankFailure(
                f"rank {self.rank} stopped by the launcher (SIGTERM){reason}", failed[0] if failed else None
            )
        raise _StopRequested

    def _run(self) -> None:
        store_down_since: float | None = None
        while not self._stopped.wait(self.interval_s):
            try:
                self.store.add(f"beat/{self.rank}", 1)
                reason = self._peer_problem()
                store_down_since = None
            except Exception as exc:  # the store is gone: rank 0 / the launcher died
                store_down_since = store_down_since or time.monotonic()
                if time.monotonic() - store_down_since < min(self.timeout_s, 10.0):
                    continue
                reason = RankFailure(
                    f"rank {self.rank} lost the launch's key-value store ({_describe(exc)}): "
                    "rank 0 or the launcher is gone",
                    0,
                )
            if reason is not None:
                self._stop_this_rank(reason)
                return

    def _peer_problem(self) -> RankFailure | None:
        failed = self.failed_peer()
        if failed is not None:
            return RankFailure(f"rank {self.rank} stops: rank {failed[0]} failed: {failed[1]}", failed[0])
        silent = self.silent_peers(self.timeout_s)
        if silent:
            return RankFailure(
                f"rank {self.rank} stops: rank {silent[0]} gave no sign of life for {self.timeout_s:.0f} s "
                "(killed, or its machine is gone)",
                silent[0],
            )
        return None

    def _stop_this_rank(self, reason: RankFailure) -> None:
        self.stop_reason = reason
        print(f"[rlf] {reason}", file=sys.stderr, flush=True)
        _thread.interrupt_main(signal.SIGTERM)  # the main thread raises at its next Python line
        # A main thread blocked inside a collective never gets there; give cleanup a moment, then go.
        if not self._stopped.wait(min(5.0, self.timeout_s)):
            print(f"[rlf] rank {self.rank}: exiting without cleanup", file=sys.stderr, flush=True)
            os._exit(1)

    # ------------------------------------------------------------------------------ queries
    def failed_peer(self) -> tuple[int, str] | None:
        """The lowest other rank that reported a failure, with its error text."""
        for peer in range(self.world_size):
            if peer != self.rank and self.store.check([f"failed/{peer}"]):
                return peer, self.store.get(f"failed/{peer}").decode(errors="replace")
        return None

    def silent_peers(self, after_s: float) -> list[int]:
        """Other ranks whose heart counter has not moved for ``after_s`` seconds of this rank's clock."""
        now, silent = time.monotonic(), []
        for peer in range(self.world_size):
            if peer == self.rank or self.store.check([f"done/{peer}"]):
                continue
            count = int(self.store.add(f"beat/{peer}", 0))
            last = self._beats.get(peer)
            if last is None or last[0] != count:
                self._beats[peer] = (count, now)
            elif now - last[1] > after_s:
                silent.append(peer)
        return silent

    # ------------------------------------------------------------------------------ the failing rank
    def explain(self, exc: BaseException) -> BaseException:
        """Report ``exc`` to the other ranks and return what this rank should raise (see :func:`explain_failure`)."""
        self._stopped.set()
        if self.stop_reason is not None:  # a peer failed first: the watcher or the launcher stopped us
            if self.stop_reason.failed_rank is None:  # the launcher's SIGTERM came before any report
                culprit = self._culprit(wait_s=min(6.0, self.timeout_s))
                if culprit is not None:
                    return RankFailure(f"{self.stop_reason}; {culprit}", culprit.failed_rank)
            return self.stop_reason
        if isinstance(exc, _StopRequested | KeyboardInterrupt):
            return RankFailure(f"rank {self.rank} was interrupted", None)
        if _is_collective_error(exc):
            culprit = self._culprit(wait_s=min(10.0, self.timeout_s))
            if culprit is not None:
                return culprit
        try:
            self.store.set(f"failed/{self.rank}", _describe(exc))
        except Exception:  # the store is gone too; the launcher reports this rank's exit
            logger.debug("could not report the failure of rank %d", self.rank, exc_info=True)
        print(f"[rlf] rank {self.rank} failed: {_describe(exc)}", file=sys.stderr, flush=True)
        return exc

    def _culprit(self, wait_s: float) -> RankFailure | None:
        """After a collective failed here: the peer that failed first (its report, or its silence)."""
        deadline = time.monotonic() + wait_s
        try:
            self.silent_peers(wait_s)  # start the clocks now
            while time.monotonic() < deadline:
                failed = self.failed_peer()
                if failed is not None:
                    return RankFailure(
                        f"rank {self.rank} stops: rank {failed[0]} failed: {failed[1]}", failed[0]
                    )
                silent = self.silent_peers(3 * self.interval_s + 1.0)
                if silent:
                    return RankFailure(
                        f"rank {self.rank} stops: rank {silent[0]} died (no heartbeat; killed, or its "
                        "machine is gone)",
                        silent[0],
                    )
                time.sleep(self.interval_s / 2)
        except Exception:
            return RankFailure(
                f"rank {self.rank} stops: the launch's key-value store is gone (rank 0 or the launcher died)",
                0,
            )
        return None


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
