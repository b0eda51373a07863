"""Who a sandboxed call runs as: a uid of its own when the server is root, and how it reaches python.

Each call of a root server runs as a uid no account uses, unique on the machine while the call
runs: ``SANDBOX_UID_BASE + (server pid mod 2**22) * UIDS_PER_PROCESS + n``. The kernel then
counts ``RLIMIT_NPROC`` for that call alone, enforces file permissions against it, and a call's
end can kill every process of its uid without touching another call or another server.

An unprivileged uid must be able to walk to the interpreter. One installed under a ``0700`` home
(``/root/.pyenv/...``) is reached through descriptors the supervisor opens for it
(:class:`Launch` with ``pinned_prefix``): the interpreter runs as ``/proc/self/fd/4`` with
``PYTHONHOME=/proc/self/fd/3``, and the kernel still checks every name below the prefix.

Example:
    >>> pool = UidPool(base=2_000_000_000, size=4)
    >>> first = pool.take(); second = pool.take()
    >>> second - first, pool.in_use()
    (1, 2)
    >>> pool.give_back(first); pool.in_use()
    1
    >>> world_reachable("/usr/bin")
    True
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
import threading
from dataclasses import dataclass

SANDBOX_UID_BASE = 2_000_000_000
UIDS_PER_PROCESS = 512
PID_BLOCKS = 2**22  # the kernel's largest pid_max: each server process gets a block of its own
PINNED_PREFIX_FD = 3  # the numbers supervisor.py gives the pinned descriptors
PINNED_BINARY_FD = 4
PLAIN_FLAGS = ("-I", "-S", "-B", "-u", "-X", "utf8")
# -I would ignore PYTHONHOME: the same isolation spelled out (-s -P), the environment being ours
PINNED_FLAGS = ("-s", "-S", "-B", "-P", "-u", "-X", "utf8")


class UidPoolExhaustedError(RuntimeError):
    """More calls at once in this process than it has uids."""


class UidPool:
    """The uids this server process gives its calls, one per running call (thread-safe)."""

    def __init__(self, base: int | None = None, size: int = UIDS_PER_PROCESS) -> None:
        if base is None:
            base = SANDBOX_UID_BASE + (os.getpid() % PID_BLOCKS) * UIDS_PER_PROCESS
        self.base, self.size = base, size
        self._free = list(reversed(range(base, base + size)))
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._free:
                raise UidPoolExhaustedError(f"all {self.size} sandbox uids of this process are in use")
            return self._free.pop()

    def give_back(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)

    def in_use(self) -> int:
        with self._lock:
            return self.size - len(self._free)

    def bounds(self) -> list[int]:
        return [self.base, self.base + self.size - 1]


@functools.lru_cache(maxsize=1)
def process_uid_pool() -> UidPool:
    """The one pool of this process, shared by every sandbox in it (so no two calls share a uid)."""
    return UidPool()


def world_reachable(path: str) -> bool:
    """Whether any user may walk to ``path`` (every parent searchable) and read it."""
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return False
    wanted = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    if mode & wanted != wanted:
        return False
    parent = os.path.dirname(real)
    while True:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


@functools.lru_cache(maxsize=8)
def _prefixes(real_python: str) -> tuple[str, str, str]:
    """``(base_prefix, base_exec_prefix, stdlib directory)`` of an interpreter."""
    if real_python == os.path.realpath(sys.executable):
        import sysconfig

        return sys.base_prefix, sys.base_exec_prefix, sysconfig.get_paths()["stdlib"]
    code = "import sys, sysconfig; print(sys.base_prefix); print(sys.base_exec_prefix); print(sysconfig.get_paths()['stdlib'])"  # fmt: skip
    out = subprocess.run([real_python, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    base, exec_base, stdlib = out.stdout.splitlines()
    return base, exec_base, stdlib


@dataclass(frozen=True)
class Launch:
    """How the supervisor starts the interpreter: argv head, extra environment, what to pin."""

    executable: str
    flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    pinned_prefix: str = ""
    pinned_binary: str = ""

    @property
    def pinned_fds(self) -> str:
        """The prelude's PINNED_FDS argument."""
        return f"{PINNED_PREFIX_FD},{PINNED_BINARY_FD}" if self.pinned_prefix else "-"


def plan_launch(real_python: str, drop_root: bool) -> Launch:
    """Start ``real_python`` directly, or through pinned descriptors when a dropped uid cannot reach it."""
    base, exec_base, stdlib = _prefixes(real_python)
    if not drop_root or (world_reachable(real_python) and world_reachable(stdlib)):
        return Launch(real_python, PLAIN_FLAGS)
    if os.path.realpath(base) != os.path.realpath(exec_base):
        raise OSError(
            f"cannot reach {real_python} as another uid, and its prefixes differ ({base}, {exec_base})"
        )
    home = f"/proc/self/fd/{PINNED_PREFIX_FD}"
    env = (("PYTHONHOME", home), ("LD_LIBRARY_PATH", f"{home}/lib"))  # a shared libpython lives there
    return Launch(f"/proc/self/fd/{PINNED_BINARY_FD}", PINNED_FLAGS, env, os.path.realpath(base), real_python)
