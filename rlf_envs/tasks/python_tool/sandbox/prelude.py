"""The code each sandbox child runs before the user's program: resource limits, an audit hook, then the program.

The server starts ``python -I -S -B -u -X utf8 -c <this file's source> WORKDIR CPU_S MEMORY_BYTES
FILE_BYTES OPEN_FILES PROCESSES [EXTRA_READ_ROOT ...]`` with WORKDIR as the working directory and the
program's source on stdin (so its size is not bounded by the argv limit). This file runs in that child
only: it uses the standard library alone (``-I -S`` leaves nothing else importable) and never imports
rlf_envs.

The audit hook (PEP 578) refuses, with ``PermissionError`` (``ImportError`` for imports):
sockets and network clients; starting or signalling processes (fork, exec, spawn, system, Popen);
reading files outside WORKDIR, the interpreter's import path and the extra read roots; writing,
creating, renaming or deleting anything outside WORKDIR; symlinks and hard links; changing resource
limits; walking the garbage collector's object graph; and importing ``ctypes``, ``_posixsubprocess``,
subinterpreters and CPython's test modules. Functions that reach other processes without raising an
audit event (``signal.pidfd_send_signal``, ``os.setpriority``, ``os.sched_setaffinity``, ``os.chroot``,
...) are deleted before the program runs. It is defence in depth, not a security boundary: see
docs/sandbox.md for what it does not stop.

Example (what the server runs; the program comes on stdin):
    python -I -S -B -u -X utf8 -c "$(cat prelude.py)" /tmp/rlf-sandbox-x 5 268435456 16777216 64 64
"""

import sys

USER_FILENAME = "<code>"
PRELUDE_FILENAME = "<string>"  # what CPython names code run with -c

# Events refused outright, by exact name or by prefix (a whole module's events).
NETWORK_PREFIXES = (
    "socket.",
    "urllib.",
    "http.client.",
    "ftplib.",
    "smtplib.",
    "poplib.",
    "imaplib.",
    "nntplib.",
    "telnetlib.",
    "webbrowser.",
    "syslog.",  # the C syslog writes to a unix socket without a socket.* event
)
PROCESS_EVENTS = frozenset(
    {
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "subprocess.Popen",
        "pty.spawn",
        "os.startfile",
    }
)
OTHER_DENIED_EVENTS = frozenset(
    {
        "resource.setrlimit",
        "resource.prlimit",
        # the object graph is how code would find the hook and rewrite what it captured
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        # a link inside WORKDIR pointing outside would make later path checks depend on a race
        "os.symlink",
        "os.link",
        "sqlite3.enable_load_extension",
        "sqlite3.load_extension",
    }
)
DENIED_IMPORTS = frozenset(
    {
        "ctypes",
        "_ctypes",
        "_posixsubprocess",  # fork_exec starts programs without any audit event
        "_xxsubinterpreters",  # a subinterpreter does not inherit this interpreter's audit hooks
        "_xxinterpchannels",
        "_dbm",  # these open files from C, without an "open" event
        "_gdbm",
        "readline",
        "_posixshmem",  # shm_open creates files under /dev/shm without an "open" event
        "_multiprocessing",  # sem_open, likewise
        # loaded before the hook; importing them again would bring back what disarm() removed
        "_signal",
        "posix",
    }
)
# Functions that act on other processes without any audit event; removed before the program runs.
UNAUDITED_FUNCTIONS = {
    "_signal": ("pidfd_send_signal",),  # kills any process the user may signal, like os.kill
    "posix": ("setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "chroot"),
    "os": ("setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "chroot"),
}
# Events whose path arguments must be readable: event -> index of the path.
READ_EVENTS = (("os.listdir", 0), ("os.scandir", 0), ("os.chdir", 0), ("os.listxattr", 0), ("os.getxattr", 0))
# Events that change the file system: event -> ((index of a path, index of its dir_fd or None), ...).
WRITE_EVENTS = (
    ("os.remove", ((0, 1),)),
    ("os.rmdir", ((0, 1),)),
    ("os.mkdir", ((0, 2),)),
    ("os.rename", ((0, 2), (1, 3))),
    ("os.chmod", ((0, 2),)),
    ("os.chown", ((0, 3),)),
    ("os.chflags", ((0, None),)),
    ("os.lchflags", ((0, None),)),
    ("os.utime", ((0, 3),)),
    ("os.truncate", ((0, None),)),
    ("os.mkfifo", ((0, 2),)),
    ("os.mknod", ((0, 3),)),
    ("os.setxattr", ((0, None),)),
    ("os.removexattr", ((0, None),)),
    ("shutil.rmtree", ((0, 1),)),
)
READABLE_FILES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
WRITABLE_FILES = frozenset({"/dev/null"})
MAX_SYMLINKS = 40


def set_limits(cpu_s: int, memory_bytes: int, file_bytes: int, open_files: int, processes: int) -> None:
    """Lower this process's rlimits (soft and hard, so the program cannot raise them back)."""
    import resource

    wanted = (
        # past the soft CPU limit the kernel sends SIGXCPU, past the hard one SIGKILL
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_AS, memory_bytes, memory_bytes),
        (resource.RLIMIT_FSIZE, file_bytes, file_bytes),
        (resource.RLIMIT_NOFILE, open_files, open_files),
        # not enforced for root: the audit hook is what stops fork there (see docs/sandbox.md)
        (resource.RLIMIT_NPROC, processes, processes),
        (resource.RLIMIT_CORE, 0, 0),
    )
    for limit, soft, hard in wanted:
        _, current_hard = resource.getrlimit(limit)
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(limit, (soft, hard))


def disarm() -> None:
    """Delete :data:`UNAUDITED_FUNCTIONS` from the modules already loaded (the others load without them)."""
    for module_name, names in UNAUDITED_FUNCTIONS.items():
        module = sys.modules.get(module_name)
        for name in names:
            if module is not None and hasattr(module, name):
                delattr(module, name)


def make_audit_hook(workdir: str, read_roots: tuple[str, ...]):
    """The audit hook: allows what the sandbox allows and raises for the rest.

    Everything the hook uses is captured here as an immutable value or a C function, and the hook
    calls no Python helper: a traceback through a refused call exposes the hook's frame and its
    locals, and the program may rebind builtins or patch ``os``/``posixpath``, so nothing the hook
    relies on may be reachable and mutable.
    """
    import posix
    from _stat import S_ISLNK

    getcwd, lstat, readlink = posix.getcwd, posix.lstat, posix.readlink
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_APPEND | posix.O_CREAT | posix.O_TRUNC
    _isinstance, _type, _str, _bytes, _int, _len, _tuple = isinstance, type, str, bytes, int, len, tuple
    _PermissionError, _ImportError, _OSError = PermissionError, ImportError, OSError
    as_exact_str, decode = str.__str__, bytes.decode  # str subclasses could lie about their content
    readable_roots = (workdir, *read_roots)
    writable_roots = (workdir,)
    network_prefixes, process_events, other_denied = NETWORK_PREFIXES, PROCESS_EVENTS, OTHER_DENIED_EVENTS
    denied_imports, read_events, write_events = DENIED_IMPORTS, READ_EVENTS, WRITE_EVENTS
    read_event_names = frozenset(name for name, _ in READ_EVENTS)
    write_event_names = frozenset(name for name, _ in WRITE_EVENTS)
    readable_files, writable_files, max_symlinks = READABLE_FILES, WRITABLE_FILES, MAX_SYMLINKS
    read_hint = "only the working directory and the Python standard library are readable"
    write_hint = "only the working directory is writable"

    def audit_hook(event: str, args: tuple) -> None:
        # --- events refused whatever their arguments
        if event.startswith(network_prefixes):
            raise _PermissionError(f"sandbox: network access is not allowed ({event})")
        if event in process_events:
            raise _PermissionError(f"sandbox: starting or signalling processes is not allowed ({event})")
        if event in other_denied or event.startswith("ctypes."):
            raise _PermissionError(f"sandbox: {event} is not allowed")
        if event == "import":
            name = as_exact_str(args[0])
            root = name.partition(".")[0]
            if root in denied_imports or root.startswith("_test"):
                raise _ImportError(f"sandbox: importing {name!r} is not allowed", name=name)
            return

        # --- events on paths: collect (path, dir_fd, needs_write), then check each one
        checks: tuple = ()
        if event == "open":
            path, mode, flags = args
            if _isinstance(path, _int):
                return  # an already open descriptor: opening it was checked
            if mode is None:  # os.open
                write = (flags & write_flags) != 0
            else:
                mode = as_exact_str(mode)
                write = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            checks = ((path, None, write),)
        elif event in read_event_names:
            for name, index in read_events:
                if name == event:
                    path = args[index] if _len(args) > index else None
                    checks = (("." if path is None else path, None, False),)
        elif event in write_event_names:
            for name, pairs in write_events:
                if name == event:
                    checks = _tuple(
                        [
                            (args[i], args[fd] if fd is not None and _len(args) > fd else None, True)
                            for i, fd in pairs
                        ]
                    )
        elif event == "sqlite3.connect":
            database = args[0]
            if _isinstance(database, _bytes):
                database = decode(database, "utf-8", "surrogateescape")
            if _isinstance(database, _str) and as_exact_str(database) in (":memory:", ""):
                return
            if _isinstance(database, _str) and as_exact_str(database).startswith("file:"):
                raise _PermissionError("sandbox: sqlite URIs are not allowed; pass a plain file name")
            checks = ((database, None, True),)
        else:
            return

        for path, dir_fd, write in checks:
            if _isinstance(path, _int):
                continue
            if _isinstance(path, _bytes):
                path = decode(path, "utf-8", "surrogateescape")
            elif _isinstance(path, _str):
                path = as_exact_str(path)
            else:
                raise _PermissionError(
                    f"sandbox: {event} needs a str or bytes path, got {_type(path).__name__}"
                )
            if "\x00" in path:
                raise _PermissionError("sandbox: paths may not contain NUL")

            # resolve like os.path.realpath: absolute, '.'/'..' removed, symlinks followed
            if not path.startswith("/"):
                if dir_fd is None or dir_fd == -1:  # -1: the default, "relative to the cwd"
                    base = getcwd()
                else:  # relative to an open directory: the kernel knows which one
                    try:
                        base = readlink(f"/proc/self/fd/{_int(dir_fd)}")
                    except _OSError:
                        base = ""
                    if not base.startswith("/"):
                        raise _PermissionError(
                            f"sandbox: {event} relative to descriptor {dir_fd!r} is not allowed"
                        )
                path = base + "/" + path
            pending = path.split("/")
            pending.reverse()
            parts: list = []
            links = 0
            while pending:
                part = pending.pop()
                if part in ("", "."):
                    continue
                if part == "..":
                    if parts:
                        parts.pop()
                    continue
                candidate = "/" + "/".join(parts) + ("/" if parts else "") + part
                try:
                    is_link = S_ISLNK(lstat(candidate).st_mode)
                except _OSError:
                    is_link = False  # does not exist (yet): nothing to follow
                if not is_link:
                    parts.append(part)
                    continue
                links += 1
                if links > max_symlinks:
                    raise _PermissionError(f"sandbox: too many symbolic links in {path!r}")
                target = readlink(candidate)
                if target.startswith("/"):
                    parts = []
                more = target.split("/")
                more.reverse()
                pending.extend(more)
            resolved = "/" + "/".join(parts)

            roots, files = (writable_roots, writable_files) if write else (readable_roots, readable_files)
            if resolved in files:
                continue
            allowed = False
            for root in roots:
                if resolved == root or resolved.startswith(root + "/"):
                    allowed = True
                    break
            if not allowed:
                verb, hint = ("writing", write_hint) if write else ("reading", read_hint)
                raise _PermissionError(f"sandbox: {verb} {resolved!r} is not allowed ({hint})")

    return audit_hook


def run_user_code(source: str) -> int:
    """Run ``source`` as the ``__main__`` module; returns the exit status (tracebacks go to stderr)."""
    import builtins

    module = type(sys)("__main__")
    namespace = module.__dict__
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv = [USER_FILENAME]
    try:
        exec(compile(source, USER_FILENAME, "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as error:  # any failure of the program is reported the way Python would
        report_exception(error, source)
        return 1
    return 0


def report_exception(error: BaseException, source: str) -> None:
    """Print ``error``'s traceback without this prelude's frame, with the program's lines shown."""
    try:
        import linecache
        import traceback

        linecache.cache[USER_FILENAME] = (len(source), None, source.splitlines(True), USER_FILENAME)
        report = traceback.TracebackException(type(error), error, error.__traceback__)
        pending, seen = [report], set()
        while pending:  # this prelude's frames (run with -c, so named "<string>") mean nothing to the program
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            frames = [frame for frame in current.stack if frame.filename != PRELUDE_FILENAME]
            current.stack = traceback.StackSummary.from_list(frames)
            pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        sys.stderr.write("".join(report.format()))
    except BaseException:  # e.g. no memory left to import traceback
        sys.stderr.write(f"{type(error).__name__}: {error}\n")


def main(argv: list[str]) -> int:
    import os.path

    workdir, cpu_s, memory_bytes, file_bytes, open_files, processes, *extra_roots = argv
    source = sys.stdin.buffer.read().decode("utf-8", "replace")
    set_limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(open_files), int(processes))
    # resolved now, before any user code runs, with the same semantics the hook applies later
    roots = tuple(os.path.realpath(p) for p in (*sys.path, *extra_roots) if p)
    disarm()
    sys.addaudithook(make_audit_hook(os.path.realpath(workdir), roots))
    # -S skips site, which is what normally defines exit() and quit()
    import builtins

    builtins.exit = builtins.quit = sys.exit
    return run_user_code(source)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
