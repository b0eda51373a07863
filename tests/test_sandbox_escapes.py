"""Escape attempts against the python sandbox under bubblewrap (guards mode: tests/test_sandbox_guards.py).

The bwrap layer is tested two ways:

- **the whole sandbox** (``PythonSandbox(isolation="bwrap")``: bwrap, rlimits and the audit hook):
  every attack must fail, and the same sandbox must answer a normal call right after it;
- **bwrap alone** (:mod:`rlf_envs.isolation` running ``python -I -S -c CODE`` with no audit hook, as
  if native code had got past the guards): the attack runs, but its goal must still fail.

Each attack is first checked to work *outside* the sandbox (the file is there, the server answers,
the helper reads the file), so a pass means the sandbox stopped it. These tests skip with the
reason when bwrap cannot run here; ``scripts/test.sh`` installs it where apt-get is available.
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from rlf_envs.isolation import Layout, interpreter_roots, probe_bubblewrap, sandbox_python
from rlf_envs.tasks.python_tool import PythonToolTask
from rlf_envs.tasks.python_tool.sandbox import (
    PythonSandbox,
    SandboxConfigError,
    SandboxLimits,
    SandboxResult,
    SandboxStartError,
)

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MISSING_BWRAP = "/nonexistent/rlf-test/bwrap"
PROBE = probe_bubblewrap()
BWRAP = PROBE.bubblewrap
needs_bwrap = pytest.mark.skipif(
    BWRAP is None,
    reason=f"bubblewrap is not usable here ({PROBE.problem}); scripts/test.sh installs it with apt-get",
)
NORMAL_CODE = "print(6 * 7)"
ESCAPE_UID = 2_000_000_900  # the bwrap-alone runs use a uid of their own, to look for leftovers
HELPER_SOURCE = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *file = fopen(argv[i], "r");
        char line[256];
        if (file == NULL) { printf("helper: cannot open %s\n", argv[i]); continue; }
        if (fgets(line, sizeof line, file) != NULL) printf("helper: read %s: %s", argv[i], line);
        fclose(file);
    }
    return 0;
}
"""


# --- fixtures and runners ---------------------------------------------------------------------


def full_sandbox(**limits: Any) -> PythonSandbox:
    """bwrap + rlimits + audit hook, with small limits so the abuse cases stay quick."""
    chosen = {"cpu_s": 2, "wall_s": 20, "memory_mb": 128, "disk_mb": 8, "file_size_mb": 4, **limits}
    return PythonSandbox(SandboxLimits(**chosen), isolation="bwrap")


def attack_then_normal(code: str, **limits: Any) -> tuple[SandboxResult, SandboxResult]:
    """Run ``code`` and then a normal program on one sandbox; the normal one must print 42."""
    sandbox = full_sandbox(**limits)

    async def both() -> tuple[SandboxResult, SandboxResult]:
        return await sandbox.run(code), await sandbox.run(NORMAL_CODE)

    attack, normal = asyncio.run(both())
    assert normal.ok and normal.stdout == "42\n", normal.to_text()
    assert sandbox.stats()["in_flight"] == 0
    return attack, normal


def run_bwrap_alone(code: str, *, tmp_mb: int = 8) -> subprocess.CompletedProcess[str]:
    """``python -I -S -c code`` under bwrap only: no prelude, so no rlimits and no audit hook."""
    assert BWRAP is not None
    layout = Layout(
        read_only=interpreter_roots(sys.executable), workdir="/tmp/work", tmp_mb=tmp_mb, uid=ESCAPE_UID
    )
    argv = BWRAP.command([sandbox_python(sys.executable), "-I", "-S", "-c", code], layout)
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def processes_left(uid: int, within_s: float) -> list[int]:
    """:func:`processes_of` ``uid`` once none is left, or after ``within_s`` seconds (a process that
    was killed is gone within moments; one that was not stays, and is returned)."""
    deadline = time.monotonic() + within_s
    while (pids := processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return pids


def processes_of(uid: int) -> list[int]:
    """Host pids whose real uid is ``uid``."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid_line = next(line for line in status.read_text().splitlines() if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(uid_line.split()[1]) == uid:
            pids.append(int(status.parent.name))
    return pids


@pytest.fixture(scope="module")
def secret_in_home() -> Iterator[Path]:
    """A marker file in the real home directory, removed afterwards."""
    marker = Path.home() / f".rlf-escape-marker-{secrets.token_hex(4)}"
    marker.write_text("rlf escape marker: home is readable\n")
    try:
        yield marker
    finally:
        marker.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def helper_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny C program, compiled outside the sandbox, that prints the first line of each file named."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the helper")
    folder = tmp_path_factory.mktemp("helper")
    (folder / "helper.c").write_text(HELPER_SOURCE)
    subprocess.run([gcc, "-O1", "-o", str(folder / "helper"), str(folder / "helper.c")], check=True)
    outside = subprocess.run(
        [str(folder / "helper"), str(README)], capture_output=True, text=True, check=True
    )
    assert outside.stdout.startswith(f"helper: read {README}")  # it works outside the sandbox
    return folder / "helper"


@pytest.fixture(scope="module")
def local_server() -> Iterator[tuple[int, list[str]]]:
    """A real HTTP server on 127.0.0.1 in a thread: ``(port, paths it was asked for)``."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"reached")

        def log_message(self, *args: Any) -> None:
            """Silent: the test reads ``hits``, not the server's request log on stderr."""

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/host-check", timeout=5).read() == b"reached"
    hits.clear()
    try:
        yield port, hits
    finally:
        server.shutdown()
        server.server_close()


# --- the whole sandbox: every attack fails, the next call works --------------------------------

DENIED_READ = "is not allowed (only the working directory and the Python standard library are readable)"
FULL_STACK_ATTACKS = {
    "ctypes_system": ("import ctypes\nctypes.CDLL(None).system(b'id')", "importing 'ctypes' is not allowed"),
    "os_system": (f"import os\nos.system('cat {README}')", "not allowed (os.system)"),
    "subprocess_run": (
        f"import subprocess\nsubprocess.run(['cat', '{README}'])",
        "'_posixsubprocess' is not allowed",
    ),  # fmt: skip
    "read_project": (f"print(open({str(README)!r}).read())", f"sandbox: reading '{README}' {DENIED_READ}"),
    "list_project": (
        f"import os\nprint(os.listdir({str(REPO)!r}))",
        f"sandbox: reading '{REPO}' {DENIED_READ}",
    ),
    "fork_bomb": ("import os\nwhile True:\n    os.fork()", "not allowed (os.fork)"),
    "allocate_10_gb": ("x = bytearray(10 * 1024 ** 3)", "MemoryError"),
    "grow_until_memory_runs_out": (
        "x = []\nwhile True:\n    x.append(bytearray(8 * 1024 ** 2))",
        "MemoryError",
    ),
}


@needs_bwrap
@pytest.mark.parametrize("case", sorted(FULL_STACK_ATTACKS))
def test_attack_fails_in_the_whole_sandbox_and_the_next_call_works(case: str) -> None:
    code, expected = FULL_STACK_ATTACKS[case]
    attack, _ = attack_then_normal(code)
    assert expected in attack.to_text(), attack.to_text()
    assert not attack.ok


@needs_bwrap
def test_home_and_helpers_outside_are_out_of_reach(secret_in_home: Path, helper_binary: Path) -> None:
    read, _ = attack_then_normal(f"print(open({str(secret_in_home)!r}).read())")
    assert f"sandbox: reading '{secret_in_home}' {DENIED_READ}" in read.to_text()
    listed, _ = attack_then_normal(f"import os\nprint(os.listdir({str(Path.home())!r}))")
    assert "sandbox: reading" in listed.to_text() and secret_in_home.name not in listed.stdout
    helper, _ = attack_then_normal(
        f"import os\nos.execv({str(helper_binary)!r}, ['helper', {str(README)!r}])"
    )
    assert "not allowed (os.exec)" in helper.to_text() and "helper:" not in helper.stdout


@needs_bwrap
def test_a_binary_written_into_the_working_directory_cannot_be_run(helper_binary: Path) -> None:
    payload = base64.b64encode(helper_binary.read_bytes()).decode()
    code = (
        "import base64, os\n"
        f"open('helper', 'wb').write(base64.b64decode({payload!r}))\n"
        "os.chmod('helper', 0o755)\n"
        f"os.execv('./helper', ['helper', {str(README)!r}])"
    )
    attack, _ = attack_then_normal(code)
    assert "not allowed (os.exec)" in attack.to_text() and "helper:" not in attack.stdout


@needs_bwrap
def test_writes_outside_tmp_fail_and_leave_nothing_on_the_host() -> None:
    name = f"rlf-escape-{secrets.token_hex(4)}"
    for target in (f"/usr/{name}", f"/etc/{name}", str(REPO / name), str(Path.home() / name)):
        attack, _ = attack_then_normal(f"open({target!r}, 'w').write('escaped')")
        assert f"sandbox: writing '{target}' is not allowed" in attack.to_text(), attack.to_text()
        assert not Path(target).exists()


@needs_bwrap
def test_a_server_on_127_0_0_1_is_not_reachable(local_server: tuple[int, list[str]]) -> None:
    port, hits = local_server
    raw, _ = attack_then_normal(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
    http, _ = attack_then_normal(
        f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}/x')"
    )
    assert (
        "network access is not allowed" in raw.to_text() and "network access is not allowed" in http.to_text()
    )
    assert hits == []


@needs_bwrap
def test_filling_the_disk_stops_at_the_private_tmpfs() -> None:
    code = (
        "import os\nwritten = 0\n"
        "try:\n"
        "    for i in range(64):\n"
        "        with open(f'f{i}', 'wb', buffering=0) as f:\n"
        "            for _ in range(2):\n"
        "                f.write(b'x' * 1024 ** 2)\n"
        "                written += 1\n"
        "except OSError as error:\n"
        "    print(written, error)\n"
    )
    attack, _ = attack_then_normal(code, disk_mb=8)  # 64 files of 2 MB would pass RLIMIT_FSIZE (4 MB)
    written, message = attack.stdout.split(" ", 1)
    assert "[Errno 28] No space left on device" in message and int(written) <= 8, attack.to_text()


# --- bwrap alone: the guards are bypassed, the goal still fails --------------------------------


@needs_bwrap
def test_native_code_runs_but_sees_neither_project_nor_home(secret_in_home: Path) -> None:
    files = f"{README} {secret_in_home} /etc/passwd"
    code = (
        "import ctypes, os, subprocess\n"
        f"print('ctypes', ctypes.CDLL(None).system(b'cat {files} 2>&1'), flush=True)\n"
        f"print('system', os.system('cat {files} 2>&1'), flush=True)\n"
        f"print('subprocess', subprocess.run(['cat', *{files.split()!r}], capture_output=True, text=True))\n"
        f"print(os.path.exists({str(REPO)!r}), sorted(os.listdir({str(Path.home())!r})) if os.path.isdir({str(Path.home())!r}) else None)\n"  # fmt: skip
    )
    done = run_bwrap_alone(code)
    out = done.stdout
    assert done.returncode == 0, done.stderr
    assert out.count(f"cat: {README}: No such file or directory") == 3
    assert out.count(f"cat: {secret_in_home}: No such file or directory") == 3
    assert README.read_text().splitlines()[0] not in out and "escape marker" not in out and "root:" not in out
    assert "False" in out.splitlines()[-1] and secret_in_home.name not in out.splitlines()[-1]


@needs_bwrap
def test_a_helper_runs_only_from_inside_and_reads_nothing(helper_binary: Path) -> None:
    payload = base64.b64encode(helper_binary.read_bytes()).decode()
    code = (
        "import base64, os, subprocess\n"
        f"try:\n    os.execv({str(helper_binary)!r}, ['helper'])\nexcept OSError as error:\n    print('outside:', error)\n"  # fmt: skip
        f"open('/tmp/helper', 'wb').write(base64.b64decode({payload!r}))\n"
        "os.chmod('/tmp/helper', 0o755)\n"
        f"print(subprocess.run(['/tmp/helper', {str(README)!r}, '/etc/passwd'], capture_output=True, text=True).stdout)"
    )
    done = run_bwrap_alone(code)
    assert "outside: [Errno 2] No such file or directory" in done.stdout, done.stdout + done.stderr
    # the copy inside runs (it is native code in the namespaces) but cannot open the host's files
    assert f"helper: cannot open {README}" in done.stdout and "helper: cannot open /etc/passwd" in done.stdout
    assert "helper: read" not in done.stdout


@needs_bwrap
def test_writes_outside_tmp_hit_a_read_only_system() -> None:
    name = f"rlf-escape-{secrets.token_hex(4)}"
    targets = [f"/usr/{name}", f"/etc/{name}", f"/{name}", str(REPO / name), str(Path.home() / name), f"/dev/shm/{name}"]  # fmt: skip
    code = (
        f"for target in {targets!r}:\n"
        "    try:\n        open(target, 'w').write('escaped')\n        print(target, 'written')\n"
        "    except OSError as error:\n        print(target, error.strerror)\n"
        "open('/tmp/inside', 'w').write('fine')\nprint('tmp', open('/tmp/inside').read())"
    )
    done = run_bwrap_alone(code)
    assert "written" not in done.stdout and "tmp fine" in done.stdout, done.stdout + done.stderr
    assert not any(Path(target).exists() for target in targets)


@needs_bwrap
def test_no_network_namespace_access_even_to_127_0_0_1(local_server: tuple[int, list[str]]) -> None:
    port, hits = local_server
    code = (
        "import socket, urllib.request\n"
        f"for attempt in (lambda: socket.create_connection(('127.0.0.1', {port}), timeout=2),\n"
        f"                lambda: urllib.request.urlopen('http://127.0.0.1:{port}/from-bwrap', timeout=2)):\n"
        "    try:\n        attempt()\n        print('connected')\n"
        "    except OSError as error:\n        print(type(error).__name__, error)\n"
    )
    done = run_bwrap_alone(code)
    assert "connected" not in done.stdout and "Connection refused" in done.stdout, done.stdout + done.stderr
    assert hits == []


@needs_bwrap
def test_host_processes_cannot_be_signalled() -> None:
    done = run_bwrap_alone(
        f"import os\ntry:\n    os.kill({os.getpid()}, 9)\nexcept OSError as e:\n    print(e)"
    )
    assert "No such process" in done.stdout, done.stdout + done.stderr


@needs_bwrap
def test_a_fork_bomb_is_bounded_and_leaves_no_process_behind() -> None:
    if not BWRAP.drops_root:
        pytest.skip("the sandbox runs as host root here (user namespace), where RLIMIT_NPROC is not enforced")
    code = (
        "import os, resource, time\n"
        "resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))\n"
        "children = 0\n"
        "try:\n"
        "    for _ in range(1000):\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(300)\n"
        "            os._exit(0)\n"
        "        children += 1\n"
        "except OSError as error:\n"
        "    print(children, error.strerror)\n"
    )
    done = run_bwrap_alone(code)
    children, reason = done.stdout.strip().split(" ", 1)
    assert int(children) < 16 and reason == "Resource temporarily unavailable", done.stdout + done.stderr
    if BWRAP.setpriv is not None:  # they ran as ESCAPE_UID: none may be left on the host
        # the sleeping children die with the pid namespace when the first process exits: the
        # kernel kills them then, but on a loaded machine they may take a moment to be gone
        assert processes_left(ESCAPE_UID, within_s=10.0) == []


@needs_bwrap
def test_filling_tmp_stops_at_its_size() -> None:
    code = (
        "written = 0\n"
        "try:\n    with open('/tmp/fill', 'wb', buffering=0) as f:\n"
        "        while True:\n            f.write(b'x' * 1024 ** 2)\n            written += 1\n"
        "except OSError as error:\n    print(written, error.strerror)\n"
    )
    done = run_bwrap_alone(code, tmp_mb=4)
    written, reason = done.stdout.strip().split(" ", 1)
    assert int(written) <= 4 and reason == "No space left on device", done.stdout + done.stderr


# --- the MCP server reports its mode; the guards fallback ---------------------------------------


def serve_and_call(*args: str) -> tuple[str, dict[str, Any], str]:
    """(instructions, sandbox_stats, text of a normal call) from a stdio server started with ``args``."""
    module_args = ["-m", "rlf_envs.tasks.python_tool.server", "--stats-tool", *args]
    params = StdioServerParameters(command=sys.executable, args=module_args, env={"PYTHONPATH": str(REPO)})

    async def scenario() -> tuple[str, dict[str, Any], str]:
        async with Client(params) as client:
            result = await client.call_tool("run_python", {"code": NORMAL_CODE})
            stats = (await client.call_tool("sandbox_stats", {})).structured_content
            return client.instructions or "", stats, result.content[0].text

    return asyncio.run(scenario())


@pytest.mark.parametrize("setting", ["auto", "guards"])
def test_the_server_says_which_mode_it_runs_in(setting: str) -> None:
    mode = "bwrap" if setting == "auto" and BWRAP is not None else "guards"
    instructions, stats, text = serve_and_call("--isolation", setting)
    assert (
        f"isolation: {mode}" in instructions
        and stats["isolation"] == stats["sandbox_info"]["isolation"] == mode
    )
    assert text == "42\n[exit code 0]"
    if mode == "bwrap":
        assert stats["sandbox_info"]["bwrap_version"] == BWRAP.version


def test_bwrap_demanded_but_missing_is_a_clear_error_everywhere() -> None:
    with pytest.raises(SandboxStartError, match=r"apt-get install bubblewrap"):
        PythonSandbox(isolation="bwrap", bwrap_path=MISSING_BWRAP)
    with pytest.raises(SandboxStartError, match=r"isolation=\"bwrap\" is not available.*was not found"):
        PythonToolTask(isolation="bwrap", bwrap_path=MISSING_BWRAP, num_train=2, num_test=2)
    server = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlf_envs.tasks.python_tool.server",
            "--isolation",
            "bwrap",
            "--bwrap",
            MISSING_BWRAP,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert server.returncode == 2 and "apt-get install bubblewrap" in server.stderr
    with pytest.raises(SandboxConfigError, match="isolation must be one of"):
        PythonSandbox(isolation="docker")
