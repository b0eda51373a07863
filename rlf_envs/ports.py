"""A free TCP port for a server that another process will bind later.

Asking the kernel for port 0 returns an *ephemeral* port: the range the kernel also hands out as the
source port of every outgoing connection and to every other bind to port 0. Between choosing a port
and a child server binding it (a `vllm serve` imports for ten seconds or more), any of those may take
it, and the server dies with "Address already in use". :func:`free_local_port` therefore picks at
random below the ephemeral range, where nothing is handed out automatically.

Example:
    >>> port = free_local_port()
    >>> low, _ = ephemeral_port_range()
    >>> 1024 < port < low
    True
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LINUX_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default when the file cannot be read
_LOWEST_CHOICE = 20000  # above the registered services most machines run
_TRIES = 200
# os entropy, not the global generator: processes that seeded `random` alike would pick alike
_CHOOSER = random.SystemRandom()


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range of automatically assigned ports (Linux's default where it is not exposed)."""
    try:
        low, high = (int(part) for part in _LINUX_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_local_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that binds now and lies outside the ephemeral range where one exists.

    Falls back to a kernel-chosen port when the range leaves no room below it or nothing there binds.
    """
    low, _ = ephemeral_port_range()
    if low - _LOWEST_CHOICE >= 1000:
        for port in _CHOOSER.sample(range(_LOWEST_CHOICE, low), min(_TRIES, low - _LOWEST_CHOICE)):
            if _bindable(host, port):
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
