"""The python sandbox MCP server as a real subprocess (streamable HTTP and stdio), and its runner.

Every escape or abuse attempt must come back as a result that shows it was denied or stopped,
and the same server must answer a normal call right after it. The server tests run twice: with
``--isolation auto`` (bubblewrap where it works) and ``--isolation guards`` (the fallback), so the
in-process guards are checked on their own too; tests/test_sandbox_escapes.py attacks bwrap itself.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from rlf_envs.isolation import probe_bubblewrap
from rlf_envs.tasks.python_tool.sandbox import (
    Outcome,
    PythonSandbox,
    SandboxConfigError,
    SandboxInputError,
    SandboxLimits,
)
from tests.helpers import free_local_port, http_server

REPO = Path(__file__).resolve().parent.parent
SERVER = [sys.executable, "-m", "rlf_envs.tasks.python_tool.server"]
# small limits keep the abuse cases fast; wall_s leaves a loaded machine room to hit the CPU limit first
SERVER_LIMITS = ["--cpu-s", "1", "--wall-s", "8", "--memory-mb", "256", "--output-chars", "2000"]
NORMAL_CODE = "print(48213 * 379)"
NORMAL_OUTPUT = "18272727"


AUTO_MODE = "bwrap" if probe_bubblewrap().bubblewrap is not None else "guards"


@pytest.fixture(scope="module", params=["auto", "guards"])
def server(request: pytest.FixtureRequest) -> Any:
    """One sandbox server over streamable HTTP per isolation setting: ``(url, port, pid)``."""
    port = free_local_port()
    argv = [*SERVER, *SERVER_LIMITS, "--stats-tool", "--isolation", request.param]
    with http_server(argv, port) as process:
        url = f"http://127.0.0.1:{port}/mcp"
        expected = AUTO_MODE if request.param == "auto" else "guards"
        assert stats_of(url)["isolation"] == expected  # auto means bwrap wherever bwrap works
        yield url, port, process.pid


def call_all(target: Any, *codes: str) -> list[Any]:
    """Run each program in turn on one client session; returns the CallToolResults."""

    async def scenario() -> list[Any]:
        async with Client(target) as client:
            return [await client.call_tool("run_python", {"code": code}) for code in codes]

    return asyncio.run(scenario())


def stats_of(target: Any) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        async with Client(target) as client:
            return (await client.call_tool("sandbox_stats", {})).structured_content

    return asyncio.run(scenario())


def text_of(result: Any) -> str:
    return result.content[0].text


def peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM) from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def test_runs_programs_and_reports_output_and_exit_status(server: Any) -> None:
    url, _, _ = server
    ok, exits, fails, syntax, both, silent = call_all(
        url,
        NORMAL_CODE,
        "import sys\nprint('bye')\nsys.exit(3)",
        "def f(x):\n    return x / 0\nf(1)",
        "print(1",
        "import sys\nprint('out')\nprint('err', file=sys.stderr)",
        "x = 2 ** 64",
    )
    assert not ok.is_error and text_of(ok) == f"{NORMAL_OUTPUT}\n[exit code 0]"
    assert ok.structured_content["ok"] and ok.structured_content["outcome"] == "exited"
    assert text_of(exits).endswith("bye\n[exit code 3]") and exits.structured_content["exit_code"] == 3
    failure = text_of(fails)
    assert 'File "<code>", line 2, in f' in failure and "ZeroDivisionError" in failure
    assert "<string>" not in failure  # the prelude's frames are not shown to the model
    assert failure.endswith("[exit code 1]")
    assert "SyntaxError" in text_of(syntax) and syntax.structured_content["exit_code"] == 1
    assert text_of(both) == "out\n[stderr]\nerr\n[exit code 0]"
    assert text_of(silent).startswith("[no output] (print() the values")


DENIED_READ = "is not allowed (only the working directory and the Python standard library are readable)"

ABUSE_CASES = {
    "read_etc_passwd": ("print(open('/etc/passwd').read())", "sandbox: reading '/etc/passwd' " + DENIED_READ),
    "read_repo_file": (
        f"import pathlib\nprint(pathlib.Path({str(REPO / 'pyproject.toml')!r}).read_text())",
        f"sandbox: reading '{REPO / 'pyproject.toml'}' " + DENIED_READ,
    ),
    "list_root": ("import os\nprint(os.listdir('/root'))", "sandbox: reading '/root' " + DENIED_READ),
    "scan_filesystem_root": ("import os\nprint([e.name for e in os.scandir('/')])", "sandbox: reading '/' "),
    "fork": ("import os\nos.fork()", "starting or signalling processes is not allowed (os.fork)"),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", "not allowed (os.fork)"),
    "subprocess_run": (
        "import subprocess\nsubprocess.run(['ls'])",
        "importing '_posixsubprocess' is not allowed",
    ),
    "os_system": ("import os\nos.system('ls /')", "not allowed (os.system)"),
    "exec_binary": ("import os\nos.execv('/bin/ls', ['ls'])", "not allowed (os.exec)"),
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)", "not allowed (os.kill)"),
    "import_ctypes": ("import ctypes\nctypes.CDLL(None)", "sandbox: importing 'ctypes' is not allowed"),
    "load_ctypes_extension": (
        "import importlib\nimportlib.import_module('_ctypes')",
        "sandbox: importing '_ctypes' is not allowed",
    ),
    "allocate_10_gb": ("x = bytearray(10 * 1024 ** 3)", "MemoryError"),
    "print_10_g_chars": ("print('x' * 10 ** 10)", "MemoryError"),
    "raise_rlimit": (
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1000, 1000))",
        "resource.setrlimit is not allowed",
    ),
    "walk_gc_for_the_hook": ("import gc\nprint(len(gc.get_objects()))", "gc.get_objects is not allowed"),
    "symlink_out": (
        "import os\nos.symlink('/etc/passwd', 'p')\nprint(open('p').read())",
        "os.symlink is not allowed",
    ),
    "patched_builtins_and_posixpath": (
        "import builtins, posixpath\n"
        "builtins.isinstance = lambda *a: True\n"
        "posixpath.realpath = posixpath.abspath = lambda *a, **k: '/tmp'\n"
        "print(open('/etc/passwd').read())",
        "sandbox: reading '/etc/passwd' ",
    ),
    "fspath_that_changes_its_answer": (
        "import _io\nclass P:\n    def __fspath__(self):\n        return '/etc/passwd'\n_io.FileIO(P())",
        "needs a str or bytes path",
    ),
    "pidfd_kill_parent": (
        "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(os.getppid()), signal.SIGKILL)",
        "module 'signal' has no attribute 'pidfd_send_signal'",
    ),
    "chroot": ("import os\nos.chroot('/')", "module 'os' has no attribute 'chroot'"),
    "remove_through_a_stdlib_dir_fd": (
        "import os\nfd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\nos.remove('os.py', dir_fd=fd)",
        f"sandbox: writing '{Path(os.__file__).resolve()}' is not allowed",
    ),
    "sqlite_file_outside": (
        "import sqlite3\nsqlite3.connect('/root/evil.db')",
        "sandbox: writing '/root/evil.db'",
    ),
}


@pytest.mark.parametrize("case", sorted(ABUSE_CASES))
def test_abuse_is_denied_and_the_server_keeps_serving(server: Any, case: str) -> None:
    url, _, _ = server
    code, expected = ABUSE_CASES[case]
    abuse, normal = call_all(url, code, NORMAL_CODE)
    assert not abuse.is_error, text_of(abuse)
    assert expected in text_of(abuse), text_of(abuse)
    assert abuse.structured_content["outcome"] == "exited" and abuse.structured_content["exit_code"] == 1
    assert text_of(normal) == f"{NORMAL_OUTPUT}\n[exit code 0]"


def test_writes_outside_the_working_directory_are_denied(server: Any, tmp_path: Path) -> None:
    url, _, _ = server
    target = tmp_path / "escaped.txt"
    absolute, relative, inside = call_all(
        url,
        f"open({str(target)!r}, 'w').write('x')",
        "import os\nos.open('../rlf-escaped.txt', os.O_WRONLY | os.O_CREAT)",
        "import os, shutil, tempfile\n"
        "os.makedirs('a/b')\nopen('a/b/notes.txt', 'w').write('kept')\nprint(open('a/b/notes.txt').read())\n"
        "shutil.rmtree('a')\nwith tempfile.TemporaryDirectory() as scratch:\n    print(os.listdir('.'))",
    )
    assert f"sandbox: writing '{target}' is not allowed" in text_of(absolute)
    # os.open's event does not say whether dir_fd was given, so a relative name may only be read
    assert "sandbox: os.open with a relative path may only read" in text_of(relative)
    assert not target.exists() and not Path("/tmp/rlf-escaped.txt").exists()
    assert text_of(inside).startswith("kept\n['tmp"), text_of(inside)  # the working directory is writable
    assert text_of(inside).endswith("[exit code 0]")


def test_network_is_denied_even_to_a_live_local_port(server: Any) -> None:
    url, port, _ = server  # the server's own port accepts connections, so only the sandbox can refuse
    raw, http, normal = call_all(
        url,
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
        f"import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{port}/mcp').read())",
        NORMAL_CODE,
    )
    assert "sandbox: network access is not allowed (socket." in text_of(raw)
    assert "sandbox: network access is not allowed (urllib.Request)" in text_of(http)
    assert text_of(normal).startswith(NORMAL_OUTPUT)


def test_cpu_burner_is_killed_and_the_server_keeps_serving(server: Any) -> None:
    url, _, _ = server
    burner, normal = call_all(url, "while True:\n    pass", NORMAL_CODE)
    # 1 CPU second normally ends it (SIGXCPU); on a saturated machine the 8 s wall clock may come first
    assert burner.structured_content["outcome"] in ("cpu_limit", "wall_timeout")
    assert "[killed: " in text_of(burner) and "limit of" in text_of(burner)
    assert text_of(normal).startswith(NORMAL_OUTPUT)


def test_output_floods_are_cut_and_server_memory_stays_bounded(server: Any) -> None:
    url, _, pid = server
    before_kb = peak_rss_kb(pid)
    floods = call_all(
        url,
        "while True:\n    print('x' * 100_000)",  # gigabytes if nothing stopped it
        "import sys\nsys.stdout.write('y' * 10 ** 8)",  # one 100 MB write
        "import sys\nwhile True:\n    sys.stderr.write('e' * 65536)",
        "print('z' * 5000)",
        NORMAL_CODE,
    )
    *cut, normal = floods
    for result in cut:
        assert result.structured_content["outcome"] == "output_limit", text_of(result)
        assert result.structured_content["output_truncated"]
        kept = result.structured_content["stdout"] + result.structured_content["stderr"]
        assert len(kept) == 2000 and "[killed: output exceeded 2000 characters" in text_of(result)
    assert text_of(normal).startswith(NORMAL_OUTPUT)
    grown_kb = peak_rss_kb(pid) - before_kb
    assert grown_kb < 32 * 1024, f"server peak RSS grew by {grown_kb} kB during the floods"


def test_each_call_gets_a_fresh_directory_that_is_removed(server: Any) -> None:
    url, _, _ = server
    first, second = call_all(
        url,
        "import os\nopen('state.txt', 'w').write('1')\nprint(os.getcwd())",
        "import os\nprint(os.getcwd(), os.listdir('.'))",
    )
    first_dir = text_of(first).splitlines()[0]
    second_dir, listing = text_of(second).splitlines()[0].split(" ", 1)
    assert first_dir != second_dir and listing == "[]"
    assert "rlf-sandbox-" in first_dir and not Path(first_dir).exists() and not Path(second_dir).exists()


def test_bad_input_is_a_tool_error(server: Any) -> None:
    url, _, _ = server
    empty, long_code, normal = call_all(url, "  \n", "x = 1\n" * 20_000, NORMAL_CODE)
    assert empty.is_error and "code is empty" in text_of(empty)
    assert long_code.is_error and "the limit is 100000" in text_of(long_code)
    assert not normal.is_error


def stdio_params(*args: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "rlf_envs.tasks.python_tool.server", *args],
        env={"PYTHONPATH": str(REPO)},
        cwd=str(REPO),
    )


def test_concurrent_calls_overlap_over_stdio() -> None:
    async def scenario() -> tuple[list[Any], dict[str, Any], list[Any]]:
        async with Client(stdio_params("--stats-tool", "--max-concurrency", "16")) as client:
            tools = [tool.name for tool in (await client.list_tools()).tools]
            assert tools == ["run_python", "sandbox_stats"]
            code = "import time\ntime.sleep(1)\nprint('done')"
            results = await asyncio.gather(
                *(client.call_tool("run_python", {"code": code}) for _ in range(8))
            )
            stats = (await client.call_tool("sandbox_stats", {})).structured_content
            crash = await client.call_tool(
                "run_python", {"code": "import faulthandler\nfaulthandler._sigsegv()"}
            )
            after = await client.call_tool("run_python", {"code": NORMAL_CODE})
            return results, stats, [crash, after]

    results, stats, (crash, after) = asyncio.run(scenario())
    assert [text_of(r) for r in results] == ["done\n[exit code 0]"] * 8
    # all 8 children were alive at once: the calls ran concurrently, not one after another
    assert stats["peak_in_flight"] == 8 and stats["in_flight"] == 0 and stats["calls"] == 8
    assert crash.structured_content["outcome"] == "signalled" and "[killed by signal SIGSEGV]" in text_of(
        crash
    )
    assert text_of(after).startswith(NORMAL_OUTPUT)


# --- the runner in-process (real child processes, no MCP) --------------------------------------


def test_wall_clock_limit_kills_a_sleeping_program() -> None:
    sandbox = PythonSandbox(SandboxLimits(cpu_s=1, wall_s=1))
    result = asyncio.run(sandbox.run("import time\nprint('start', flush=True)\ntime.sleep(60)"))
    assert result.outcome is Outcome.WALL_TIMEOUT and result.stdout == "start\n"
    assert result.to_text().endswith("[killed: wall-clock limit of 1 s exceeded]")
    assert sandbox.stats()["in_flight"] == 0


def test_max_concurrency_queues_the_extra_calls() -> None:
    sandbox = PythonSandbox(SandboxLimits(), max_concurrency=2)

    async def scenario() -> list[Any]:
        return await asyncio.gather(*(sandbox.run("import time\ntime.sleep(0.5)") for _ in range(4)))

    results = asyncio.run(scenario())
    assert all(r.ok for r in results)
    assert sandbox.stats()["peak_in_flight"] == 2 and sandbox.stats()["calls"] == 4


def test_limits_and_input_are_validated() -> None:
    with pytest.raises(SandboxConfigError, match="cpu_s"):
        SandboxLimits(cpu_s=0)
    with pytest.raises(SandboxConfigError, match="too small"):
        SandboxLimits(memory_mb=8)
    with pytest.raises(SandboxInputError, match="empty"):
        asyncio.run(PythonSandbox().run(""))
