"""The code each sandbox child runs before the user's program: resource limits, an audit hook, then the program.

The server runs ``python -c <audit_hook.py's source + this file's source> WORKDIR CPU_S MEMORY_BYTES
FILE_BYTES OPEN_FILES PROCESSES PINNED_FDS [EXTRA_READ_ROOT ...]`` with WORKDIR as the working
directory and the program's source on stdin (so its size is not bounded by the argv limit);
PINNED_FDS is ``-`` or the comma-separated descriptors through which the interpreter reaches its
own prefix (see supervisor.py). This code runs in that child only: it uses the standard library
alone (``-S`` leaves nothing else importable) and never imports rlf_envs there.

Before the program runs it lowers the rlimits, removes the functions that act on other processes
without an audit event and every way to create them again (``_imp.create_builtin`` and
``_imp.exec_builtin``, once every allowed built-in module is loaded), and installs the audit hook
of audit_hook.py. It is defence in depth, not a security boundary: see docs/sandbox.md.

Example (what the server runs; the program comes on stdin):
    python -I -S -B -u -X utf8 -c "$(cat audit_hook.py prelude.py)" /tmp/rlf-sandbox-x 5 268435456 16777216 64 64 -
"""

import sys

if "make_audit_hook" not in globals():  # imported as a module (docs, tests), not run as the prelude
    from rlf_envs.tasks.python_tool.sandbox.audit_hook import DENIED_IMPORTS, install_audit_hook

USER_FILENAME = "<code>"
PRELUDE_FILENAME = "<string>"  # what CPython names code run with -c
# Functions that act on other processes without any audit event; removed before the program runs.
UNAUDITED_FUNCTIONS = {
    "_signal": ("pidfd_send_signal",),  # kills any process the user may signal, like os.kill
    "posix": ("setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "chroot"),
    "os": ("setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam", "chroot"),
}
# What re-creates a built-in module, with every function disarm() removed, without an audit event.
MODULE_FACTORIES = ("create_builtin", "exec_builtin")


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
    """Delete :data:`UNAUDITED_FUNCTIONS`, then the factories that could make them again.

    Every allowed built-in module is imported first, since importing one later needs
    ``_imp.create_builtin``; a program that removes one from ``sys.modules`` cannot get it back.
    """
    import _imp
    import warnings

    with warnings.catch_warnings():  # a deprecated built-in module must not warn in every call
        warnings.simplefilter("ignore")
        for name in sys.builtin_module_names:
            if name not in sys.modules and name not in DENIED_IMPORTS and not name.startswith("_test"):
                __import__(name)
    for module_name, names in UNAUDITED_FUNCTIONS.items():
        module = sys.modules.get(module_name)
        for name in names:
            if module is not None and hasattr(module, name):
                delattr(module, name)
    for name in MODULE_FACTORIES:
        if hasattr(_imp, name):
            delattr(_imp, name)


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
    workdir, cpu_s, memory_bytes, file_bytes, open_files, processes, pinned, *extra_roots = argv
    source = sys.stdin.buffer.read().decode("utf-8", "replace")
    set_limits(int(cpu_s), int(memory_bytes), int(file_bytes), int(open_files), int(processes))
    pinned_fds = tuple(int(fd) for fd in pinned.split(",")) if pinned != "-" else ()
    disarm()
    install_audit_hook(workdir, tuple(sys.path), tuple(extra_roots), pinned_fds, int(open_files))
    # -S skips site, which is what normally defines exit() and quit()
    import builtins

    builtins.exit = builtins.quit = sys.exit
    return run_user_code(source)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
