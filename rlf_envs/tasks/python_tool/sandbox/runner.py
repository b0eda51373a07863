"""PythonSandbox: runs python source in a fresh, limited child process per call, many calls at once.

Each call gets a new working directory and a new interpreter, ``python -I -S -B -u -X utf8 -c
<prelude>``, in its own session (so the whole process group can be killed), with a minimal
environment. Where bubblewrap works (``isolation="auto"`` or ``"bwrap"``, see
:mod:`rlf_envs.isolation`) the interpreter runs inside bwrap: its own namespaces, no network, a
read-only view of ``/usr`` and the interpreter's prefix only, and a private size-limited tmpfs that
holds ``/tmp`` and the working directory; as root it also runs as a uid of its own. Otherwise
(``"guards"``) it runs directly, in a temporary directory that is removed afterwards. In both modes
the prelude (``prelude.py``) lowers the rlimits and installs the audit hook before the program
runs; this side enforces the wall-clock and output limits and always kills the group.

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
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlf_envs.isolation import (
    DEFAULT_BWRAP,
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
from rlf_envs.tasks.python_tool.sandbox.limits import SandboxConfigError, SandboxLimits
from rlf_envs.tasks.python_tool.sandbox.output import CappedOutput
from rlf_envs.tasks.python_tool.sandbox.result import Outcome, SandboxResult

PRELUDE_SOURCE = Path(__file__).with_name("prelude.py").read_text(encoding="utf-8")
INTERPRETER_FLAGS = ("-I", "-S", "-B", "-u", "-X", "utf8")
# after the process is dead its pipes close at once, unless something outside its group holds them
PIPE_GRACE_S = 1.0
DEFAULT_MAX_CONCURRENCY = 16
# Under bwrap as root, call slot k runs as uid SANDBOX_UID_BASE + k, a uid no account uses: the
# kernel counts RLIMIT_NPROC per uid, so each call's process limit counts that call alone.
SANDBOX_UID_BASE = 2_000_000_000


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
        self._bwrap: Bubblewrap | None = None
        self._read_only: tuple[str, ...] = ()
        if self.isolation is IsolationMode.BWRAP:
            self._bwrap = probe_bubblewrap(bwrap_path).bubblewrap
            self._read_only = (*interpreter_roots(python), *self.extra_read_roots)
        self._inner_python = sandbox_python(python)  # a venv's bin/python links outside the sandbox
        self._free_uids = [SANDBOX_UID_BASE + slot for slot in reversed(range(max_concurrency))]
        self._slots = asyncio.Semaphore(max_concurrency)
        self._calls = 0
        self._waiting = 0
        self._in_flight = 0
        self._peak_in_flight = 0
        self._outcomes: Counter[str] = Counter()

    def info(self) -> dict[str, Any]:
        """How calls are isolated: ``{"isolation": "bwrap" | "guards", ...}`` (bwrap's version, uid)."""
        if self._bwrap is None:
            return {"isolation": IsolationMode.GUARDS.value}
        info = self._bwrap.info()
        if self._bwrap.setpriv is not None:
            info["host_uids"] = [SANDBOX_UID_BASE, SANDBOX_UID_BASE + self.max_concurrency - 1]
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

    def _make_workdir(self) -> str:
        try:
            return tempfile.mkdtemp(prefix="rlf-sandbox-", dir=self.tmp_root)
        except OSError as error:
            raise SandboxStartError(f"could not create the working directory: {error}") from error

    def _command(self, python: str, workdir: str) -> list[str]:
        return [
            python,
            *INTERPRETER_FLAGS,
            "-c",
            PRELUDE_SOURCE,
            workdir,
            *self.limits.prelude_args(),
            *self.extra_read_roots,
        ]

    async def _run_guarded(self, code: str) -> SandboxResult:
        workdir = self._make_workdir()
        try:
            return await self._run_in(self._command(self.python, workdir), workdir, _child_env(workdir), code)
        finally:
            remove_tree(workdir)

    async def _run_bwrapped(self, code: str) -> SandboxResult:
        """Run in bwrap: the working directory lives in the call's private tmpfs, gone with it."""
        assert self._bwrap is not None
        workdir = f"/tmp/rlf-sandbox-{secrets.token_hex(6)}"
        uid = self._free_uids.pop()  # a slot is held, so a uid is free
        layout = Layout(
            read_only=self._read_only,
            workdir=workdir,
            tmp_mb=int(self.limits.disk_mb),
            env=_child_env(workdir),
            uid=uid,
        )
        argv = self._bwrap.command(self._command(self._inner_python, workdir), layout)
        try:
            return await self._run_in(argv, "/", {"PATH": "/usr/bin:/bin"}, code)
        finally:
            self._free_uids.append(uid)

    async def _run_in(self, argv: list[str], cwd: str, env: dict[str, str], code: str) -> SandboxResult:
        limits = self.limits
        started = time.monotonic()
        try:
            process = await asyncio.create_subprocess_exec(
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

        self._in_flight += 1
        self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        killed_for: list[Outcome] = []

        def kill(reason: Outcome) -> None:
            if not killed_for:
                killed_for.append(reason)
            kill_group(process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.kill()  # the group kill already did it, unless the child left its group

        output = CappedOutput(limits.output_chars, on_overflow=lambda: kill(Outcome.OUTPUT_LIMIT))
        assert process.stdout is not None and process.stderr is not None
        pumps = [
            asyncio.create_task(output.pump(process.stdout, "stdout")),
            asyncio.create_task(output.pump(process.stderr, "stderr")),
        ]
        try:
            try:
                await asyncio.wait_for(_feed_and_wait(process, code), timeout=limits.wall_s)
            except TimeoutError:
                kill(Outcome.WALL_TIMEOUT)
                await process.wait()
            kill_group(process.pid)  # anything the program left behind in its group
            _, pending = await asyncio.wait(pumps, timeout=PIPE_GRACE_S)
            for pump in pending:
                pump.cancel()
        finally:
            if process.returncode is None:  # cancelled mid-run: never leave the child behind
                kill_group(process.pid)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            for pump in pumps:
                pump.cancel()
            self._in_flight -= 1

        exit_code = _exit_status(process.returncode, via_bwrap=self._bwrap is not None)
        return SandboxResult(
            stdout=output.text("stdout"),
            stderr=output.text("stderr"),
            exit_code=exit_code,
            outcome=killed_for[0] if killed_for else _outcome_of(exit_code),
            output_truncated=output.truncated,
            duration_s=time.monotonic() - started,
            cpu_limit_s=float(limits.cpu_whole_s),
            wall_limit_s=float(limits.wall_s),
            output_limit_chars=limits.output_chars,
        )


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


async def _feed_and_wait(process: asyncio.subprocess.Process, code: str) -> None:
    assert process.stdin is not None
    try:
        process.stdin.write(code.encode("utf-8", "surrogatepass"))
        await process.stdin.drain()
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the child died before reading its program; its exit status says why
    await process.wait()


def _outcome_of(returncode: int | None) -> Outcome:
    if returncode is not None and returncode < 0:
        return Outcome.CPU_LIMIT if -returncode == signal.SIGXCPU else Outcome.SIGNALLED
    return Outcome.EXITED


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (the child runs in its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def remove_tree(path: str) -> None:
    """Delete a working directory, even one where the program took away its own permissions."""

    def make_writable_and_retry(_function: Any, failed: str, _exc_info: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IRWXU)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    shutil.rmtree(path, onerror=make_writable_and_retry)
