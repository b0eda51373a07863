"""The guards-mode supervisor: starts one call's interpreter, and kills every descendant at the end.

The server starts ``python -I -S -B -c <this file's source> UID PIN_PREFIX PIN_BINARY -- ARGV...``
in a new session, with the call's pipes as stdin, stdout and stderr. This file runs in that process
only (standard library alone; never imports rlf_envs), as the server's user. It:

1. makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every orphaned descendant of the
   call, including one that called ``setsid`` and holds the output pipes, is re-parented to it;
2. when PIN_PREFIX / PIN_BINARY are not empty, opens them as ``O_PATH`` descriptors 3 and 4 for the
   child (the interpreter then runs as ``/proc/self/fd/4`` with ``PYTHONHOME=/proc/self/fd/3``):
   an unprivileged uid cannot walk to an interpreter installed under a ``0700`` home, but it can
   follow a descriptor its parent opened; the kernel still checks every name below it;
3. forks the interpreter: as root it sets ``no_new_privs``, drops every group, switches to UID (an
   unused uid of this call's own, so the kernel enforces ``RLIMIT_NPROC`` and file permissions)
   and asks for SIGKILL if the supervisor dies, then executes ARGV;
4. waits for it, or for SIGTERM (the server's "stop now": wall clock, output limit, cancel);
5. kills what is left: every process of UID (``kill(-1)`` from that uid) and every descendant
   (they are all its children now, as a subreaper), until it has no child;
6. ends the way the interpreter ended: the same exit status, or death by the same signal.

Example (what the server runs; ``-1``: do not switch uid):
    python -I -S -B -c "$(cat supervisor.py)" -1 '' '' -- python -I -S -c 'print(42)'
"""

import contextlib
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PINNED_PREFIX_FD = 3
PINNED_BINARY_FD = 4
REAP_PAUSE_S = 0.005
SETUP_FAILED = 125  # the supervisor itself failed (the message is on stderr)
EXEC_FAILED = 127


class StopRequested(Exception):
    """The server sent SIGTERM: end the call now."""


def prctl_function():
    """libc's ``prctl`` (ctypes is fine here: this process is trusted and runs no user code)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl


def pin(path: str, fd: int) -> None:
    """Open ``path`` as an inheritable ``O_PATH`` descriptor numbered ``fd``."""
    opened = os.open(path, os.O_PATH | os.O_CLOEXEC)
    if opened != fd:
        os.dup2(opened, fd)
        os.close(opened)
    os.set_inheritable(fd, True)


def become(uid: int, prctl) -> None:
    """In the forked child: no new privileges, no groups, then ``uid`` everywhere (drops all capabilities)."""
    if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    if uid >= 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after the uid change, which clears it


def start_child(argv: list[str], uid: int, prctl) -> int:
    """Fork and execute ``argv`` as ``uid``; the child never returns."""
    pid = os.fork()
    if pid != 0:
        return pid
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        become(uid, prctl)
        os.execve(argv[0], argv, os.environ)
    except BaseException as error:  # the child must never return into the supervisor's code
        os.write(2, f"sandbox supervisor: could not start the interpreter: {error}\n".encode())
    os._exit(EXEC_FAILED)


def wait_for(pid: int) -> int | None:
    """The child's wait status, or None when the server asked to stop first."""
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # a pending stop lands here
        while True:
            done, status = os.waitpid(-1, 0)  # also reaps orphans re-parented to us meanwhile
            if done == pid:
                return status
    except StopRequested:
        return None


def kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``: a child switched to that uid sends ``kill(-1)``."""
    helper = os.fork()
    if helper == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)  # every process this uid may signal, itself excepted
        except BaseException:
            pass
        os._exit(0)
    os.waitpid(helper, 0)


def children() -> list[int]:
    """Live children of this process (descendants land here once their parents die)."""
    me = os.getpid()
    try:  # CONFIG_PROC_CHILDREN: the kernel's own list (this process has one thread)
        with open(f"/proc/self/task/{me}/children", "rb") as listing:
            return [int(pid) for pid in listing.read().split()]
    except OSError:
        pass
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found.append(int(name))
    return found


def kill_descendants(uid: int) -> None:
    """Kill and reap until no child is left (each round catches the orphans of the last)."""
    import time

    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            return  # the usual case: the program left nothing behind
        if uid >= 0:
            kill_uid(uid)
        for pid in children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(REAP_PAUSE_S)


def end_like(status: int | None) -> int:
    """Exit the way the child did: die by its signal (so the server sees ``-N``), else its code."""
    if status is not None and not os.WIFSIGNALED(status):
        return os.waitstatus_to_exitcode(status)
    # the server asked to stop (it knows why): die of SIGKILL, as the program itself did
    number = signal.SIGKILL if status is None else os.WTERMSIG(status)
    if number != signal.SIGKILL:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file of the supervisor
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})
    os.kill(os.getpid(), number)
    return 128 + number  # a signal that does not kill (it cannot have killed the child either)


def main(argv: list[str]) -> int:
    uid_text, pin_prefix, pin_binary, separator, *child = argv
    if separator != "--" or not child:
        sys.stderr.write("sandbox supervisor: usage: UID PIN_PREFIX PIN_BINARY -- ARGV...\n")
        return SETUP_FAILED
    uid = int(uid_text)

    def stop(_signum, _frame):
        raise StopRequested

    signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until the child is started
    try:
        prctl = prctl_function()
        if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise OSError("prctl(PR_SET_CHILD_SUBREAPER) failed")
        if pin_prefix:
            pin(pin_prefix, PINNED_PREFIX_FD)
        if pin_binary:
            pin(pin_binary, PINNED_BINARY_FD)
        pid = start_child(child, uid, prctl)
    except (OSError, AttributeError) as error:
        sys.stderr.write(f"sandbox supervisor: {error}\n")
        return SETUP_FAILED
    for fd, path in ((PINNED_PREFIX_FD, pin_prefix), (PINNED_BINARY_FD, pin_binary)):
        if path:
            os.close(fd)
    status = wait_for(pid)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up below must finish
    kill_descendants(uid)
    return end_like(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
