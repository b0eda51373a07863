"""The audit hook (PEP 578) each sandbox child installs before the user's program runs.

The runner prepends this file's source to ``prelude.py``'s and runs both with ``python -c``, so it
uses the standard library alone and never imports rlf_envs. The hook refuses, with
``PermissionError`` (``ImportError`` for imports): sockets and network clients; starting or
signalling processes; reading outside the working directory, the interpreter's standard library
(not its ``site-packages``) and the extra read roots; writing anywhere but the working directory;
symlinks and hard links; changing rlimits; walking the garbage collector's object graph; importing
``ctypes``, ``_posixsubprocess``, subinterpreters and the like; loading a compiled extension from
anywhere but the standard library; and rewriting the code of its own helpers. It is defence in
depth, not a security boundary: docs/sandbox.md says what it does not stop.

How the hook stays out of the program's reach: a traceback through a refused call exposes the
hook's frame, its locals and the helpers below. So the hook and its helpers use only their
arguments: immutable values and C functions captured when the hook is made (never a global or a
builtin name, which the program could rebind), and the hook refuses ``object.__setattr__`` on the
helpers (rewriting their ``__code__`` or ``__defaults__``).

Example:
    >>> policy = make_policy("/tmp/work", ("/usr/lib/python3.11",), ("/usr/lib/python3.11",), (), 64)
    >>> resolve_path("/tmp/work/../work/./notes.txt", make_kit())
    '/tmp/work/notes.txt'
    >>> path_allowed("/usr/lib/python3.11/site-packages/cffi/api.py", False, policy)
    False
"""

import sys

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
        "spwd",  # reads /etc/shadow from C (built in on Debian's python)
        "nis",  # NIS lookups over the network without a socket event
        # loaded before the hook; importing them again would bring back what disarm() removed
        "_signal",
        "posix",
    }
)
# Directories of third-party packages inside the standard library's folder: never readable, so
# neither their compiled extensions (native code) nor their Python files can be loaded.
THIRD_PARTY_DIRS = ("site-packages", "dist-packages")
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
READ_HINT = "only the working directory and the Python standard library are readable"
WRITE_HINT = "only the working directory is writable"


def make_kit() -> tuple:
    """The builtins and C functions the helpers use, captured before the program can rebind them."""
    import posix
    from _stat import S_ISDIR, S_ISLNK

    return (
        isinstance, int, str, bytes, type, str.__str__, bytes.decode,
        PermissionError, ImportError, OSError,
        posix.getcwd, posix.lstat, posix.readlink, posix.stat, S_ISLNK, S_ISDIR,
    )  # fmt: skip


def make_policy(
    workdir: str,
    read_roots: tuple,
    extension_roots: tuple,
    pinned_fds: tuple,
    max_fds: int,
) -> tuple:
    """What the hook allows: every path here is already resolved (absolute, no links)."""
    import posix

    hidden = tuple(root + "/" + name for root in extension_roots for name in THIRD_PARTY_DIRS)
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_APPEND | posix.O_CREAT | posix.O_TRUNC
    return (
        (workdir, *read_roots), (workdir,), READABLE_FILES, WRITABLE_FILES, hidden,
        extension_roots, pinned_fds, max_fds, write_flags,
    )  # fmt: skip


def as_text(event: str, path: object, kit: tuple) -> str:
    """``path`` as an exact ``str`` (subclasses and path-like objects could lie)."""
    is_instance, _, str_, bytes_, type_, as_exact_str, decode, denied, *_ = kit
    if is_instance(path, bytes_):
        path = decode(path, "utf-8", "surrogateescape")
    elif is_instance(path, str_):
        path = as_exact_str(path)
    else:
        raise denied(f"sandbox: {event} needs a str or bytes path, got {type_(path).__name__}")
    if "\x00" in path:
        raise denied("sandbox: paths may not contain NUL")
    return path


def absolute(path: str, dir_fd: object, kit: tuple) -> str:
    """``path`` made absolute: relative to the cwd, or to the directory ``dir_fd`` is open on."""
    _, int_, *_ = kit
    denied, os_error, getcwd, readlink = kit[7], kit[9], kit[10], kit[12]
    if path.startswith("/"):
        return path
    if dir_fd is None or dir_fd == -1:  # -1: the default, "relative to the cwd"
        return getcwd() + "/" + path
    try:  # relative to an open directory: the kernel knows which one
        base = readlink(f"/proc/self/fd/{int_(dir_fd)}")
    except os_error:
        base = ""
    if not base.startswith("/"):
        raise denied(f"sandbox: a path relative to descriptor {dir_fd!r} is not allowed")
    return base + "/" + path


def resolve_path(path: str, kit: tuple, max_links: int = MAX_SYMLINKS) -> str:
    """Like ``os.path.realpath`` of an absolute path: '.'/'..' removed, symlinks followed."""
    denied, os_error, lstat, readlink, is_link = kit[7], kit[9], kit[11], kit[12], kit[14]
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
            link = is_link(lstat(candidate).st_mode)
        except os_error:
            link = False  # does not exist (yet), or cannot be seen: nothing to follow
        if not link:
            parts.append(part)
            continue
        links += 1
        if links > max_links:
            raise denied(f"sandbox: too many symbolic links in {path!r}")
        target = readlink(candidate)
        if target.startswith("/"):
            parts = []
        more = target.split("/")
        more.reverse()
        pending.extend(more)
    return "/" + "/".join(parts)


def path_allowed(resolved: str, write: bool, policy: tuple) -> bool:
    """Whether the policy lets the program read (or write) the resolved path."""
    readable, writable, readable_files, writable_files, hidden, *_ = policy
    if resolved in (writable_files if write else readable_files):
        return True
    for root in hidden:
        if resolved == root or resolved.startswith(root + "/"):
            return False
    for root in writable if write else readable:
        if resolved == root or resolved.startswith(root + "/"):
            return True
    return False


def refuse_outright(
    event: str,
    kit: tuple,
    network: tuple = NETWORK_PREFIXES,
    processes: frozenset = PROCESS_EVENTS,
    others: frozenset = OTHER_DENIED_EVENTS,
) -> None:
    """Raise for the events refused whatever their arguments."""
    denied = kit[7]
    if event.startswith(network):
        raise denied(f"sandbox: network access is not allowed ({event})")
    if event in processes:
        raise denied(f"sandbox: starting or signalling processes is not allowed ({event})")
    if event in others or event.startswith("ctypes."):
        raise denied(f"sandbox: {event} is not allowed")


def check_import(
    args: tuple,
    policy: tuple,
    kit: tuple,
    denied: frozenset = DENIED_IMPORTS,
    helpers: tuple = (as_text, absolute, resolve_path, path_allowed),
) -> None:
    """Refuse denied module names (any dotted part), and extensions loaded from outside the stdlib."""
    _, _, _, _, _, as_exact_str, _, _, import_error, *_ = kit
    to_text, to_absolute, resolve, allowed = helpers
    name = as_exact_str(args[0])
    for part in name.split("."):
        if part in denied or part.startswith("_test"):
            raise import_error(f"sandbox: importing {name!r} is not allowed", name=name)
    filename = args[1]
    if filename is None:  # a plain import: the files it reads raise their own "open" events
        return
    resolved = resolve(to_absolute(to_text("import", filename, kit), None, kit), kit)
    module = resolved.rpartition("/")[2].partition(".")[0]
    inside = False
    for root in policy[5]:
        if resolved.startswith(root + "/"):
            inside = True
    if not inside or not allowed(resolved, False, policy) or module in denied:
        raise import_error(f"sandbox: loading the extension {resolved!r} is not allowed", name=name)


def os_open_checks(
    path: object, write: bool, policy: tuple, kit: tuple, numbers: type = range, to_text=as_text
) -> tuple:
    """``os.open``: its event does not say whether ``dir_fd`` was given, so a relative name must be
    allowed against the working directory *and* every directory the program holds open."""
    text = to_text("os.open", path, kit)
    if text.startswith("/"):
        return ((text, None, write),)
    denied, stat, is_dir = kit[7], kit[13], kit[15]
    if write:
        raise denied("sandbox: os.open with a relative path may only read; pass an absolute path")
    if ".." in text.split("/"):
        raise denied("sandbox: os.open with a relative path may not contain '..'")
    checks = ((text, None, False),)
    pinned, max_fds = policy[6], policy[7]
    for fd in numbers(max_fds):
        if fd in pinned:
            continue  # the interpreter's own prefix, opened for it: see supervisor.py
        try:
            is_directory = is_dir(stat(f"/proc/self/fd/{fd}").st_mode)
        except kit[9]:
            continue
        if is_directory:
            checks = (*checks, (text, fd, False))
    return checks


def path_checks(
    event: str,
    args: tuple,
    policy: tuple,
    kit: tuple,
    read_events: tuple = READ_EVENTS,
    write_events: tuple = WRITE_EVENTS,
    open_checks=os_open_checks,
) -> tuple:
    """The ``(path, dir_fd, needs_write)`` triples an event must pass; ``()`` for other events."""
    is_instance, int_, str_, bytes_, _, as_exact_str, decode, denied, *_ = kit
    if event == "open":
        path, mode, flags = args
        if is_instance(path, int_):
            return ()  # an already open descriptor: opening it was checked
        if mode is not None:
            mode = as_exact_str(mode)
            return ((path, None, "w" in mode or "a" in mode or "x" in mode or "+" in mode),)
        return open_checks(path, (flags & policy[8]) != 0, policy, kit)
    for name, index in read_events:
        if name == event:
            path = args[index] if index < args.__len__() else None
            return (("." if path is None else path, None, False),)  # None: os.listdir() and the like
    for name, pairs in write_events:
        if name == event:
            found = ()
            for index, fd in pairs:
                dir_fd = args[fd] if fd is not None and fd < args.__len__() else None
                found = (*found, (args[index], dir_fd, True))
            return found
    if event == "sqlite3.connect":
        database = args[0]
        if is_instance(database, bytes_):
            database = decode(database, "utf-8", "surrogateescape")
        if is_instance(database, str_) and as_exact_str(database) in (":memory:", ""):
            return ()
        if is_instance(database, str_) and as_exact_str(database).startswith("file:"):
            raise denied("sandbox: sqlite URIs are not allowed; pass a plain file name")
        return ((database, None, True),)
    return ()


def check_path(
    event: str,
    path: object,
    dir_fd: object,
    write: bool,
    policy: tuple,
    kit: tuple,
    hints: tuple = (READ_HINT, WRITE_HINT),
    helpers: tuple = (as_text, absolute, resolve_path, path_allowed),
) -> None:
    """Raise unless the policy allows ``path`` (relative to ``dir_fd`` when given)."""
    if kit[0](path, kit[1]):
        return  # a descriptor, already checked when it was opened
    to_text, to_absolute, resolve, allowed = helpers
    resolved = resolve(to_absolute(to_text(event, path, kit), dir_fd, kit), kit)
    if not allowed(resolved, write, policy):
        verb, hint = ("writing", hints[1]) if write else ("reading", hints[0])
        raise kit[7](f"sandbox: {verb} {resolved!r} is not allowed ({hint})")


HELPERS = (refuse_outright, check_import, path_checks, os_open_checks, as_text, absolute, resolve_path)
HELPERS += (path_allowed, check_path)


def make_audit_hook(policy: tuple):
    """The audit hook for ``policy`` (see :func:`make_policy`): allows what the sandbox allows."""
    kit = make_kit()
    helpers, denied = HELPERS, kit[7]
    refuse, imports, checks_of, check = refuse_outright, check_import, path_checks, check_path

    def audit_hook(event: str, args: tuple) -> None:
        if event == "object.__setattr__":
            for helper in helpers:
                if args[0] is helper:
                    raise denied("sandbox: the sandbox's own functions cannot be changed")
            return
        refuse(event, kit)
        if event == "import":
            imports(args, policy, kit)
            return
        for path, dir_fd, write in checks_of(event, args, policy, kit):
            check(event, path, dir_fd, write, policy, kit)

    return audit_hook


def install_audit_hook(workdir: str, stdlib: tuple, extra_roots: tuple, pinned: tuple, max_fds: int) -> None:
    """Resolve the roots (before any user code runs, as the hook will) and install the hook."""
    import os.path

    extension_roots = tuple(os.path.realpath(p) for p in stdlib if p)
    read_roots = (*extension_roots, *(os.path.realpath(p) for p in extra_roots if p))
    policy = make_policy(os.path.realpath(workdir), read_roots, extension_roots, pinned, max_fds)
    sys.addaudithook(make_audit_hook(policy))
