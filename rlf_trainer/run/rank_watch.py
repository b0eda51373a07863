"""Ending every rank of a launch when one fails: heartbeats and failure notices in the process group's store.

Each rank beats a counter in the launch's key-value store once a second; a rank whose training
raises writes its error there before it exits (:meth:`RankWatch.explain`). A watcher thread on
every rank stops its own rank, with a message naming the failed rank and its error, as soon as a
peer's error appears or a peer's heart has not beaten for ``timeout_s`` (killed, or its machine
gone). The watcher is needed because a rank blocked in a collective notices nothing by itself
until the process group's timeout: gloo raises at once only when the peer's socket closes.
:func:`rlf_trainer.run.distributed.make_accelerator` starts one when there are several processes.
"""

from __future__ import annotations

import _thread
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

_KEY_PREFIX = "rlf-rank-watch/"
_ERROR_TEXT_LIMIT = 2000


class RankFailure(RuntimeError):
    """Another rank failed (or stopped answering); this rank stops too. ``failed_rank`` is that rank."""

    def __init__(self, message: str, failed_rank: int | None) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank


class _StopRequested(BaseException):
    """Raised in the main thread by the watcher or by SIGTERM (the launcher stopping this rank)."""


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
        self._previous_sigterm: Any = None

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
            self._previous_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _restore_sigterm(self) -> None:
        """Once this rank has stopped, a (second) SIGTERM ends it as usual: no exception in cleanup code."""
        previous = self._previous_sigterm
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
            self._previous_sigterm = None

    def stop(self) -> None:
        """This rank finished normally: stop beating and tell the peers not to wait for its heart."""
        self._stopped.set()
        self._restore_sigterm()
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
        """Report ``exc`` to the other ranks and return what this rank should raise (see :func:`explain_failure`).

        Repeated SIGTERMs of the launcher are ignored for the few seconds this takes, so the
        message naming the failed rank is printed before the launcher's SIGKILL can come.
        """
        self._stopped.set()
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            result = self._diagnose(exc)
            text = _describe(result) if result is exc else str(result)
            print(
                f"[rlf] {text if result is not exc else f'rank {self.rank} failed: {text}'}",
                file=sys.stderr,
                flush=True,
            )
            return result
        finally:
            self._restore_sigterm()

    def _diagnose(self, exc: BaseException) -> BaseException:
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


__all__ = ["RankFailure", "RankWatch"]
