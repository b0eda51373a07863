"""OS isolation with bubblewrap (``bwrap``): run a process in its own namespaces, with no network.

A process started through :meth:`Bubblewrap.command` gets new pid, network, ipc, uts and cgroup
namespaces (so no host process, no host network, not even 127.0.0.1, and it dies with its parent),
and a read-only root file system that holds only ``/usr`` and its links (``/bin``, ``/lib``, ...),
the dynamic linker's files of ``/etc``, the paths the caller names (at the same path), a new
``/proc`` and ``/dev``, plus one writable place: a private size-limited tmpfs on ``/tmp`` that
holds its working directory. The project checkout, ``$HOME``, the rest of ``/etc`` and every other
host path are not there at all.

How it drops privileges depends on who runs it, and :func:`probe_bubblewrap` picks the first
variant that works here (by running a real probe once per bwrap path and caching the answer):

1. as root, bwrap creates the namespaces itself (no user namespace) and ``setpriv`` switches the
   process to an unprivileged uid (:attr:`Layout.uid`) with no capabilities, so the kernel
   enforces ``RLIMIT_NPROC`` and file permissions;
2. otherwise (not root, or root without the right to create namespaces directly), bwrap runs in a
   user namespace with every capability dropped; a root caller then stays root (uid 0) on the
   host's side, where ``RLIMIT_NPROC`` is not enforced (``"host_root"`` in :meth:`Bubblewrap.info`).

The isolation setting is ``"auto"`` (bwrap when it works, else the in-process guards, with a
warning logged once), ``"bwrap"`` (raise :class:`IsolationUnavailableError` when it does not
work) or ``"guards"`` (never bwrap). This module has one job and imports nothing else of rlf_envs.

Example (the same output with or without bwrap on the machine):
    >>> import subprocess, sys
    >>> resolve_isolation("guards")
    <IsolationMode.GUARDS: 'guards'>
    >>> probe_bubblewrap("/nonexistent/bwrap").bubblewrap is None
    True
    >>> bwrap = probe_bubblewrap().bubblewrap          # None where bwrap is missing or cannot work
    >>> argv = [sandbox_python(sys.executable), "-I", "-S", "-c", "import os; print(6 * 7)"]
    >>> if bwrap is not None:
    ...     argv = bwrap.command(argv, Layout(read_only=interpreter_roots(sys.executable)))
    >>> subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    '42\\n'
"""

from __future__ import annotations

import enum
import functools
import importlib.util
import logging
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_BWRAP",
    "DEFAULT_SANDBOX_UID",
    "INSTALL_HINT",
    "ISOLATION_CHOICES",
    "Bubblewrap",
    "BubblewrapProbe",
    "IsolationError",
    "IsolationMode",
    "IsolationSettingError",
    "IsolationUnavailableError",
    "Layout",
    "interpreter_roots",
    "package_roots",
    "probe_bubblewrap",
    "require_bubblewrap",
    "resolve_isolation",
    "sandbox_python",
]

logger = logging.getLogger(__name__)

DEFAULT_BWRAP = "bwrap"
ISOLATION_CHOICES = ("auto", "bwrap", "guards")
INSTALL_HINT = "install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`"
DEFAULT_SANDBOX_UID = 65534  # "nobody": what a root caller's sandboxed processes run as by default
PROBE_TIMEOUT_S = 20.0
# what the dynamic linker (and time.localtime) read from /etc; nothing else of /etc is visible
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
TOP_LEVEL_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
NAMESPACES_WITHOUT_USER = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")  # fmt: skip
# the capabilities setpriv needs to switch uid and clear the bounding set; it drops them all itself
SETPRIV_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")

_warned: set[str] = set()  # bwrap paths whose fallback to guards was logged
_logged: set[tuple[str, str]] = set()  # (purpose, mode) pairs already logged


class IsolationMode(enum.StrEnum):
    """How a sandboxed child is isolated."""

    BWRAP = "bwrap"  # bubblewrap namespaces (the in-process guards stay as a second layer)
    GUARDS = "guards"  # the in-process guards (rlimits, audit hook) only


class IsolationError(RuntimeError):
    """Base class of the isolation errors."""


class IsolationUnavailableError(IsolationError):
    """``isolation="bwrap"`` was demanded, but bwrap is missing or cannot create namespaces here."""


class IsolationSettingError(IsolationError, ValueError):
    """An isolation setting other than ``"auto"``, ``"bwrap"`` or ``"guards"``, or a bad :class:`Layout`."""


@dataclass(frozen=True)
class Layout:
    """What a sandboxed process sees besides the system directories, and who it runs as.

    Attributes:
        read_only: host paths (files or directories) bound read-only at the same path.
        workdir: the working directory inside; it must lie in the private ``/tmp``.
        tmp_mb: size of the private ``/tmp`` tmpfs (its files count as the writer's memory).
        env: the whole environment inside (``--clearenv`` removes everything else).
        uid: the unprivileged uid (and gid) a root caller's process switches to (variant 1).
    """

    read_only: Sequence[str] = ()
    workdir: str = "/tmp"
    tmp_mb: int = 64
    env: Mapping[str, str] = field(default_factory=lambda: {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    uid: int = DEFAULT_SANDBOX_UID

    def __post_init__(self) -> None:
        workdir = os.path.normpath(self.workdir)
        if workdir != "/tmp" and not workdir.startswith("/tmp/"):
            raise IsolationSettingError(
                f"the working directory must lie in the private /tmp, got {workdir!r}"
            )
        if self.tmp_mb < 1:
            raise IsolationSettingError(f"tmp_mb must be >= 1, got {self.tmp_mb}")
        if any(os.path.realpath(path) == "/" for path in self.read_only):
            raise IsolationSettingError("the whole root cannot be bound: name the directories needed")


@dataclass(frozen=True)
class Bubblewrap:
    """A bwrap binary that passed the probe, and how to run a command under it.

    Attributes:
        path: the bwrap binary.
        version: what ``bwrap --version`` said.
        setpriv: the ``setpriv`` that drops a root caller's process to ``Layout.uid`` (variant 1),
            or None when bwrap runs in a user namespace (variant 2).
    """

    path: str
    version: str
    setpriv: str | None = None

    @property
    def drops_root(self) -> bool:
        """Whether the sandboxed process runs as an unprivileged uid on the host (so RLIMIT_NPROC holds)."""
        return self.setpriv is not None or os.geteuid() != 0

    def info(self) -> dict[str, Any]:
        """What an env reports about this isolation (``info["sandbox"]``)."""
        return {
            "isolation": IsolationMode.BWRAP.value,
            "bwrap": self.path,
            "bwrap_version": self.version,
            "user_namespace": self.setpriv is None,
            "host_root": not self.drops_root,  # True: RLIMIT_NPROC is not enforced (see the module doc)
        }

    def command(self, argv: Sequence[str], layout: Layout | None = None) -> list[str]:
        """The argv that runs ``argv`` under bwrap with ``layout``."""
        layout = layout if layout is not None else Layout()
        args = [self.path, *self._privilege_args(), "--die-with-parent", "--new-session"]
        args += _system_args()
        args += ["--perms", "1777", "--size", str(layout.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp"]
        args += _read_only_args(layout.read_only)
        if os.path.normpath(layout.workdir) != "/tmp":
            args += ["--perms", "0777", "--dir", layout.workdir]  # 0777: the uid inside does not own it
        # bwrap's own root and /dev are tmpfs without a size limit: only the sized /tmp stays writable
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]
        args += ["--chdir", layout.workdir, "--clearenv"]
        for name, value in layout.env.items():
            args += ["--setenv", name, value]
        args.append("--")
        if self.setpriv is not None:
            uid = str(layout.uid)
            args += [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            args += ["--inh-caps=-all", "--bounding-set=-all", "--"]
        return [*args, *argv]

    def _privilege_args(self) -> list[str]:
        if self.setpriv is not None:
            caps = [arg for cap in SETPRIV_CAPS for arg in ("--cap-add", cap)]
            return [*NAMESPACES_WITHOUT_USER, "--cap-drop", "ALL", *caps]
        # a root caller would otherwise keep every capability inside its user namespace
        return ["--unshare-all", "--cap-drop", "ALL"]


@dataclass(frozen=True)
class BubblewrapProbe:
    """The probe's answer: a working :class:`Bubblewrap`, or why there is none."""

    bubblewrap: Bubblewrap | None
    problem: str = ""


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in TOP_LEVEL_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    return [*args, "--proc", "/proc", "--dev", "/dev"]


def _covered(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _read_only_args(paths: Sequence[str]) -> list[str]:
    """Read-only binds of ``paths`` at their real path, each parent created world-traversable.

    bwrap would create a missing parent with the host's mode, and a ``0700`` ``/root`` would
    hide an interpreter installed under it from the unprivileged uid.
    """
    binds: list[str] = []
    for path in sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)}):
        if not _covered(path, ["/usr", *binds]):
            binds.append(path)
    args: list[str] = []
    made: set[str] = {"/", "/tmp"}
    for path in binds:
        parents = []
        parent = os.path.dirname(path)
        while parent not in made and not _covered(parent, ["/usr"]):
            parents.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(parents):
            args += ["--perms", "0755", "--dir", directory]
            made.add(directory)
        args += ["--ro-bind", path, path]
    return args


def sandbox_python(python: str) -> str:
    """The real interpreter behind ``python`` (a venv's ``bin/python`` is a link into a place
    that is not bound inside the sandbox)."""
    found = shutil.which(python) or python
    return os.path.realpath(found)


@functools.lru_cache(maxsize=16)
def interpreter_roots(python: str) -> tuple[str, ...]:
    """The directories ``python -I -S`` needs read-only: its prefixes (stdlib, lib-dynload, libpython)."""
    real = sandbox_python(python)
    if real == os.path.realpath(sys.executable):
        prefixes = {sys.base_prefix, sys.base_exec_prefix}
    else:
        code = "import sys; print(sys.base_prefix); print(sys.base_exec_prefix)"
        out = subprocess.run([real, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
        prefixes = set(out.stdout.split())
    return tuple(sorted({os.path.realpath(p) for p in prefixes} | {os.path.dirname(real)}))


def package_roots(*packages: str) -> tuple[str, ...]:
    """What this interpreter needs read-only to import its installed packages and ``packages``.

    Its prefixes and site-packages (a venv's installed packages), plus the folder of each named
    top-level package (found without importing it), so that an editable install exposes only
    those folders of its checkout.
    """
    roots = {*interpreter_roots(sys.executable), sys.prefix, sys.exec_prefix, *site.getsitepackages()}
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{name!r} is not an importable package")
        roots.update(spec.submodule_search_locations)
    return tuple(sorted(os.path.realpath(root) for root in roots))


def _version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip().removeprefix("bubblewrap ") or "unknown"


def _candidates(path: str, version: str) -> list[Bubblewrap]:
    candidates = []
    setpriv = shutil.which("setpriv")
    # setpriv must be visible inside, and only /usr (and its links) is
    if os.geteuid() == 0 and setpriv and os.path.realpath(setpriv).startswith("/usr/"):
        candidates.append(Bubblewrap(path, version, setpriv=os.path.realpath(setpriv)))
    candidates.append(Bubblewrap(path, version))
    return candidates


def _try(candidate: Bubblewrap) -> str:
    """'' when ``candidate`` runs a python inside, else the reason it does not."""
    layout = Layout(read_only=interpreter_roots(sys.executable), workdir="/tmp/rlf-probe")
    argv = candidate.command([sandbox_python(sys.executable), "-I", "-S", "-c", "pass"], layout)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)
    if done.returncode == 0:
        return ""
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def probe_bubblewrap(path: str = DEFAULT_BWRAP) -> BubblewrapProbe:
    """Find ``path`` (a name on PATH or a file) and check, once per binary, that it can sandbox here."""
    found = shutil.which(path)
    if found is None:
        return BubblewrapProbe(None, f"bubblewrap ({path!r}) was not found; {INSTALL_HINT}")
    return _probe(os.path.realpath(found))


@functools.lru_cache(maxsize=8)
def _probe(found: str) -> BubblewrapProbe:
    version = _version(found)
    problems = []
    for candidate in _candidates(found, version):
        problem = _try(candidate)
        if not problem:
            return BubblewrapProbe(candidate)
        problems.append(problem)
    reason = "; ".join(dict.fromkeys(problems))
    return BubblewrapProbe(None, f"{found} (bubblewrap {version}) cannot sandbox a process here: {reason}")


def require_bubblewrap(path: str = DEFAULT_BWRAP) -> Bubblewrap:
    """The working bwrap at ``path``, or :class:`IsolationUnavailableError` saying why not."""
    probe = probe_bubblewrap(path)
    if probe.bubblewrap is None:
        raise IsolationUnavailableError(f'isolation="bwrap" is not available: {probe.problem}')
    return probe.bubblewrap


def resolve_isolation(setting: str, *, bwrap_path: str = DEFAULT_BWRAP, purpose: str = "") -> IsolationMode:
    """The mode ``setting`` means here: ``"auto"`` falls back to guards (warning once), ``"bwrap"`` raises.

    With a ``purpose`` (e.g. ``"RLF/SQL-v0 sqlite server"``), the mode is also logged at INFO,
    once per process for each purpose and mode.
    """
    if setting not in ISOLATION_CHOICES:
        raise IsolationSettingError(f"isolation must be one of {list(ISOLATION_CHOICES)}, got {setting!r}")
    if setting == "bwrap":
        require_bubblewrap(bwrap_path)
        mode = IsolationMode.BWRAP
    elif setting == "guards":
        mode = IsolationMode.GUARDS
    else:
        mode = _auto(bwrap_path)
    if purpose and (purpose, mode.value) not in _logged:
        _logged.add((purpose, mode.value))
        logger.info("%s: isolation=%s", purpose, mode.value)
    return mode


def _auto(bwrap_path: str) -> IsolationMode:
    probe = probe_bubblewrap(bwrap_path)
    if probe.bubblewrap is not None:
        return IsolationMode.BWRAP
    if bwrap_path not in _warned:
        _warned.add(bwrap_path)
        logger.warning(
            "sandbox isolation: bubblewrap is not usable, so sandboxed code runs with the in-process "
            "guards only, which are not a security boundary (%s)",
            probe.problem,
        )
    return IsolationMode.GUARDS
