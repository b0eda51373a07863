"""Helpers for tests that talk to real MCP servers: server configs, HTTP servers, a loop thread, pids."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from rlf_envs.runtime import LoopThread as EnvLoopThread

REPO = Path(__file__).resolve().parents[2]
FAULTY_SERVER = str(Path(__file__).with_name("faulty_server.py"))
TINY_SERVER = str(Path(__file__).with_name("tiny_server.py"))
T = TypeVar("T")


def faulty_server(prefix: str = "", *extra_args: str, **keys: Any) -> dict[str, Any]:
    """An ``mcpServers`` entry running faulty_server.py over stdio, its tools named ``prefix + name``."""
    return {
        "command": sys.executable,
        "args": [FAULTY_SERVER, "--prefix", prefix, *extra_args],
        "env": {"PYTHONPATH": str(REPO)},  # run as a script, it needs the repo to import rlf_envs
        **keys,
    }


def tiny_server(prefix: str = "", *extra_args: str, **keys: Any) -> dict[str, Any]:
    """An ``mcpServers`` entry running tiny_server.py (no SDK, starts in milliseconds) over stdio."""
    return {"command": sys.executable, "args": [TINY_SERVER, "--prefix", prefix, *extra_args], **keys}


def latency_server(*extra_args: str, **keys: Any) -> dict[str, Any]:
    """An ``mcpServers`` entry running ``python -m rlf_envs.servers.latency`` over stdio."""
    return {
        "command": sys.executable,
        "args": ["-m", "rlf_envs.servers.latency", *extra_args],
        "cwd": str(REPO),
        **keys,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def http_server(
    argv: list[str], port: int, ready_timeout_s: float = 30.0
) -> Iterator[subprocess.Popen[bytes]]:
    """Run an MCP server over streamable HTTP on 127.0.0.1:``port`` until the block ends.

    ``argv`` is the command without transport flags; yields once the port accepts connections.
    """
    command = [*argv, "--transport", "http", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, ready_timeout_s)
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def wait_for_port(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before accepting connections")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing accepted connections on port {port} within {timeout_s} s"
                ) from None
            time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


# The tests drive pools on the same kind of loop thread the envs use.
LoopThread = EnvLoopThread
