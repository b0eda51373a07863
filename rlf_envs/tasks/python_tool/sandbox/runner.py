"""PythonSandbox: runs python source in a fresh, limited child process per call, many calls at once.

Each call gets a new working directory and a new interpreter, ``python -I -S -B -u -X utf8 -c
<prelude>``, in its own session, with a minimal environment. Where bubblewrap works
(``isolation="auto"`` or ``"bwrap"``, see :mod:`rlf_envs.isolation`) the interpreter runs inside
bwrap: its own namespaces, no network, a read-only view of ``/usr`` and the interpreter's prefix
only, and a private size-limited tmpfs that holds ``/tmp`` and the working directory. Otherwise
(``"guards"``) it runs under a small supervisor (``supervisor.py``, a child subreaper that kills
every descendant at the call's end) in a private temporary directory that is removed afterwards.
In both modes a root server runs each call as an unused uid of its own (:mod:`.identity`), and the
prelude lowers the rlimits and installs the audit hook before the program runs; this side enforces
the wall-clock and output limits, and stops reading the pipes at the deadline whatever holds them.

Example:
    >>> import asyncio
    >>> sandbox = PythonSandbox(SandboxLimits(cpu_s=2))
    >>> result = asyncio.run(sandbox.run("print(48213 * 379)"))
    >>> result.stdout, result.ok
    ('18272727\\n', True)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlf_envs.isolation import (
    DEFAULT_BWRAP,
    DEFAULT_SANDBOX_UID,
    Bubblewrap,
    IsolationMode,
    IsolationSettingError,
    IsolationUnavailableError,
    Layout,
    interpreter_roots,
    probe_bubblewrap,
    resolve_isolation,
    sandbox_python,
)
from rlf_envs.tasks.python_tool.sandbox.identity import (
    PLAIN_FLAGS,
    Launch,
    UidPoolExhaustedError,
    plan_launch,
    process_uid_pool,
    world_reachable,
)
from rlf_envs.tasks.python_tool.sandbox.limits import SandboxConfigError, SandboxLimits
from rlf_envs.tasks.python_tool.sandbox.output import CappedOutput
from rlf_envs.tasks.python_tool.sandbox.processes import (
    STOP_GRACE_S,
    close_pipes,
    exited,
    feed,
    kill_group,
    reap,
    remove_tree,
    terminate,
)
from rlf_envs.tasks.python_tool.sandbox.result import Outcome, SandboxResult

_HERE = Path(__file__).parent
# the hook's helpers first: the prelude runs as one -c program and uses them
PRELUDE_SOURCE = "\n\n".join(
    (_HERE / name).read_text(encoding="utf-8") for name in ("audit_hook.py", "prelude.py")
)
SUPERVISOR_SOURCE = (_HERE / "supervisor.py").read_text(encoding="utf-8")
# after the call's processes are dead its pipes close at once; this bounds the wait if they are not
PIPE_GRACE_S = 1.0
DEFAULT_MAX_CONCURRENCY = 16
GUARDS_FALLBACK_WARNING = (
    "WARNING: bubblewrap is not usable here, so programs run with the in-process guards only, which "
    "are not a security boundary (see docs/sandbox.md); use --isolation bwrap in production"
)


class SandboxInputError(ValueError):
    """The code cannot be run as given (empty or too long); the message says why."""


class SandboxStartError(RuntimeError):
    """The sandbox could not be started: bwrap demanded but unusable, or out of processes or fds."""


class PythonSandbox:
    """Runs untrusted python source under limits; :meth:`run` never lets a program hurt the caller.

    Args:
        limits: per-call limits (CPU, memory, output, wall clock, files, processes).
        python: the interpreter to run (its standard library is what programs can import).
        tmp_root: where the per-call working directories are created (default: the system temp
            dir); a size-limited tmpfs bounds the disk a program can fill.
        max_concurrency: calls running at once; more wait for a slot (their wall clock starts
            when they get one).
        extra_read_roots: directories programs may read besides their working directory and
            the interpreter's standard library (e.g. a data directory).
        isolation: ``"auto"`` (bubblewrap when it works here, else the guards alone, with a
            warning logged once), ``"bwrap"`` (:class:`SandboxStartError` when it does not work)
            or ``"guards"`` (the in-process guards only).
        bwrap_path: the bubblewrap binary (a name on PATH or a path).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        python: str = sys.executable,
        tmp_root: str | os.PathLike[str] | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        extra_read_roots: Sequence[str | os.PathLike[str]] = (),
        isolation: str = "auto",
        bwrap_path: str = DEFAULT_BWRAP,
    ) -> None:
        if max_concurrency < 1:
            raise SandboxConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.limits = limits if limits is not None else SandboxLimits()
        self.python = python
        if tmp_root is not None and not Path(tmp_root).is_dir():
            raise SandboxConfigError(f"tmp_root {str(tmp_root)!r} is not a directory")
        self.tmp_root = str(tmp_root) if tmp_root is not None else None
        self.max_concurrency = max_concurrency
        self.extra_read_roots = [str(Path(root).resolve()) for root in extra_read_roots]
        self.isolation = _resolve(isolation, bwrap_path)
        # auto fell back: said in info() and so in the server's instructions and sandbox_stats
        self.warning = (
            GUARDS_FALLBACK_WARNING if isolation == "auto" and self.isolation is IsolationMode.GUARDS else ""
        )
        self._bwrap: Bubblewrap | None = None
        self._read_only: tuple[str, ...] = ()
        if self.isolation is IsolationMode.BWRAP:
            self._bwrap = probe_bubblewrap(bwrap_path).bubblewrap
            self._read_only = (*interpreter_roots(python), *self.extra_read_roots)
        self._inner_python = sandbox_python(python)  # a venv's bin/python links outside the sandbox
        self._uids = process_uid_pool()
        self._drop_root = os.geteuid() == 0
        self._launch = (
            self._plan_guarded_launch() if self._bwrap is None else Launch(self._inner_python, PLAIN_FLAGS)
        )
        self._slots = asyncio.Semaphore(max_concurrency)
        self._calls = 0
        self._waiting = 0
        self._in_flight = 0
        self._peak_in_flight = 0
        self._outcomes: Counter[str] = Counter()

    def _plan_guarded_launch(self) -> Launch:
        if self._drop_root:
            parent = self.tmp_root or tempfile.gettempdir()
            if not world_reachable(parent):
                raise SandboxConfigError(
                    f"tmp_root {parent!r} must be reachable by every user: as root each call runs as a uid of its own"
                )
        try:
            return plan_launch(self._inner_python, self._drop_root)
        except (OSError, ValueError) as error:
            raise SandboxStartError(f"cannot run {self.python} as an unprivileged uid: {error}") from error

    def info(self) -> dict[str, Any]:
        """How calls are isolated: ``{"isolation": "bwrap" | "guards", ...}``: bwrap's version, the uids
        calls run as (``host_uids``, when the server is root), and ``warning`` when ``auto`` fell back."""
        info: dict[str, Any] = {"isolation": IsolationMode.GUARDS.value}
        if self._bwrap is not None:
            info = self._bwrap.info()
        if self._drop_root and (self._bwrap is None or self._bwrap.setpriv is not None):
            info["host_uids"] = self._uids.bounds()
        if self._bwrap is None:
            info["subreaper"] = True  # every descendant of a call is killed at its end
        if self.warning:
            info["warning"] = self.warning
        return info

    def stats(self) -> dict[str, Any]:
        """Counters since start: ``calls``, ``waiting``, ``in_flight`` (live children), ``peak_in_flight``, ``outcomes``."""
        return {
            "calls": self._calls,
            "waiting": self._waiting,
            "in_flight": self._in_flight,
            "peak_in_flight": self._peak_in_flight,
            "outcomes": dict(self._outcomes),
        }

    async def run(self, code: str) -> SandboxResult:
        """Run ``code`` as a fresh ``__main__`` and return its capped output and how it ended.

        A program that fails, is denied something, or is killed for a limit is a normal result;
        only unusable input (:class:`SandboxInputError`) or a failure to start the interpreter
        (:class:`SandboxStartError`) raise.
        """
        if not code.strip():
            raise SandboxInputError("code is empty: pass a Python program, e.g. print(2 ** 100)")
        if len(code) > self.limits.code_chars:
            raise SandboxInputError(
                f"code is {len(code)} characters long; the limit is {self.limits.code_chars}"
            )
        self._calls += 1
        self._waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
        try:
            result = await (self._run_guarded(code) if self._bwrap is None else self._run_bwrapped(code))
        finally:
            self._slots.release()
        self._outcomes[result.outcome.value] += 1
        return result

    def _take_uid(self) -> int:
        if not self._drop_root:
            return -1
        try:
            return self._uids.take()
        except UidPoolExhaustedError as error:
            raise SandboxStartError(str(error)) from error

    def _release_uid(self, uid: int) -> None:
        if uid >= 0:
            self._uids.give_back(uid)

    def _make_workdir(self, uid: int) -> str:
        """A new directory of mode 0700, owned by the call's uid: no other call can read it."""
        try:
            workdir = tempfile.mkdtemp(prefix="rlf-sandbox-", dir=self.tmp_root)
            if uid >= 0:
                os.chown(workdir, uid, uid)
            return workdir
        except OSError as error:
            raise SandboxStartError(f"could not create the working directory: {error}") from error

    def _command(self, launch: Launch, workdir: str) -> list[str]:
        return [
            launch.executable,
            *launch.flags,
            "-c",
            PRELUDE_SOURCE,
            workdir,
            *self.limits.prelude_args(),
            launch.pinned_fds,
            *self.extra_read_roots,
        ]

    async def _run_guarded(self, code: str) -> SandboxResult:
        """Run under the supervisor, as the call's own uid when the server is root."""
        uid = self._take_uid()
        try:
            workdir = self._make_workdir(uid)
            try:
                launch = self._launch
                supervisor = [self._inner_python, "-I", "-S", "-B", "-c", SUPERVISOR_SOURCE, str(uid)]
                supervisor += [launch.pinned_prefix, launch.pinned_binary, "--"]
                env = {**_child_env(workdir), **dict(launch.env)}
                argv = [*supervisor, *self._command(launch, workdir)]
                return await self._run_in(argv, workdir, env, code, stop=terminate)
            finally:
                remove_tree(workdir)
        finally:
            self._release_uid(uid)

    async def _run_bwrapped(self, code: str) -> SandboxResult:
        """Run in bwrap: the working directory lives in the call's private tmpfs, gone with it."""
        assert self._bwrap is not None
        workdir = f"/tmp/rlf-sandbox-{secrets.token_hex(6)}"
        uid = self._take_uid() if self._bwrap.setpriv is not None else -1
        layout = Layout(
            read_only=self._read_only,
            workdir=workdir,
            tmp_mb=int(self.limits.disk_mb),
            env=_child_env(workdir),
            uid=uid if uid >= 0 else DEFAULT_SANDBOX_UID,
        )
        argv = self._bwrap.command(self._command(self._launch, workdir), layout)
        try:
            return await self._run_in(argv, "/", {"PATH": "/usr/bin:/bin"}, code, stop=kill_group)
        finally:
            self._release_uid(uid)

    async def _run_in(
        self, argv: list[str], cwd: str, env: dict[str, str], code: str, stop: Callable[[int], None]
    ) -> SandboxResult:
        """Run ``argv``; ``stop(pid)`` ends the call early (wall clock, output limit). It returns
        within about ``wall_s + 2 * STOP_GRACE_S + PIPE_GRACE_S`` whatever holds the pipes."""
        limits = self.limits
        started = time.monotonic()
        process = await _start(argv, cwd, env)
        self._in_flight += 1
        self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        killed_for: list[Outcome] = []

        def end_early(reason: Outcome) -> None:
            if not killed_for:
                killed_for.append(reason)
            stop(process.pid)

        output = CappedOutput(limits.output_chars, on_overflow=lambda: end_early(Outcome.OUTPUT_LIMIT))
        assert process.stdout is not None and process.stderr is not None
        pumps = [
            asyncio.create_task(output.pump(process.stdout, "stdout")),
            asyncio.create_task(output.pump(process.stderr, "stderr")),
        ]
        try:
            await feed(process, code)
            if not await exited(process, started + limits.wall_s - time.monotonic()):
                end_early(Outcome.WALL_TIMEOUT)
            await reap(process)
            # stop reading at the deadline even if something outside the call still holds the pipes
            _, pending = await asyncio.wait(pumps, timeout=PIPE_GRACE_S)
            for pump in pending:
                pump.cancel()
        finally:
            if process.returncode is None:  # cancelled mid-run: never leave the child behind
                kill_group(process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await exited(process, STOP_GRACE_S)
            for pump in pumps:
                pump.cancel()
            close_pipes(process)
            self._in_flight -= 1

        exit_code = _exit_status(process.returncode, via_bwrap=self._bwrap is not None)
        outcome = killed_for[0] if killed_for else _outcome_of(exit_code)
        return self._result(output, exit_code, outcome, time.monotonic() - started)

    def _result(
        self, output: CappedOutput, exit_code: int | None, outcome: Outcome, took: float
    ) -> SandboxResult:
        limits = self.limits
        return SandboxResult(
            stdout=output.text("stdout"),
            stderr=output.text("stderr"),
            exit_code=exit_code,
            outcome=outcome,
            output_truncated=output.truncated,
            duration_s=took,
            cpu_limit_s=float(limits.cpu_whole_s),
            wall_limit_s=float(limits.wall_s),
            output_limit_chars=limits.output_chars,
        )


async def _start(argv: list[str], cwd: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    """Start ``argv`` in a session of its own, with pipes for its stdin, stdout and stderr."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except OSError as error:
        raise SandboxStartError(f"could not start the sandbox interpreter: {error}") from error


def _resolve(isolation: str, bwrap_path: str) -> IsolationMode:
    try:
        return resolve_isolation(isolation, bwrap_path=bwrap_path)
    except IsolationSettingError as error:
        raise SandboxConfigError(str(error)) from error
    except IsolationUnavailableError as error:
        raise SandboxStartError(str(error)) from error


def _child_env(workdir: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}


def _exit_status(returncode: int | None, *, via_bwrap: bool) -> int | None:
    """The child's status as ``-N`` for death by signal N.

    bwrap exits with 128 + N when its child dies of signal N; a program that exits with such a
    status by itself is reported as signalled too (only the status line differs).
    """
    if via_bwrap and returncode is not None and 128 < returncode < 128 + signal.NSIG:
        return -(returncode - 128)
    return returncode


def _outcome_of(returncode: int | None) -> Outcome:
    if returncode is not None and returncode < 0:
        return Outcome.CPU_LIMIT if -returncode == signal.SIGXCPU else Outcome.SIGNALLED
    return Outcome.EXITED
