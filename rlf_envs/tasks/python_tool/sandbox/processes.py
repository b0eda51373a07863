"""Ending a sandboxed call's processes: waiting with a deadline, stopping, killing, cleaning up.

Example:
    >>> import asyncio, sys
    >>> async def demo():
    ...     process = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    ...     return await exited(process, 30.0), process.returncode
    >>> asyncio.run(demo())
    (True, 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import time
from typing import Any

# how long a stopped call's processes get to end, before SIGKILL (and then before giving up)
STOP_GRACE_S = 2.0
EXIT_POLL_S = 0.01


async def feed(process: asyncio.subprocess.Process, code: str) -> None:
    """Write the program to the child's stdin and close it."""
    assert process.stdin is not None
    try:
        process.stdin.write(code.encode("utf-8", "surrogatepass"))
        await asyncio.wait_for(process.stdin.drain(), timeout=STOP_GRACE_S)
        process.stdin.close()
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass  # the child died before reading its program; its exit status says why


async def exited(process: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether the process exits within ``timeout`` seconds. Unlike ``process.wait()``, which also
    waits for its pipes to close, this does not depend on what else holds the pipes."""
    deadline = time.monotonic() + timeout
    while process.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(EXIT_POLL_S)
    return True


async def reap(process: asyncio.subprocess.Process) -> None:
    """Let the process end; past STOP_GRACE_S, SIGKILL its group (the guards' supervisor or bwrap)."""
    if not await exited(process, STOP_GRACE_S):
        kill_group(process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await exited(process, STOP_GRACE_S)
    kill_group(process.pid)  # anything the program left behind in its group


def terminate(pid: int) -> None:
    """Ask the guards' supervisor to end the call: it kills every descendant, then exits."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def close_pipes(process: asyncio.subprocess.Process) -> None:
    """Close our ends of the pipes, so a process that escaped the call cannot keep them busy."""
    transport = getattr(process, "_transport", None)  # asyncio offers no public way to close them
    if transport is not None:
        transport.close()


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
