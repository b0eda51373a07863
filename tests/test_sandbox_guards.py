"""The guards-only mode (no namespaces), attacked where it used to fail open (issue 21).

Two kinds of test, both with ``isolation="guards"`` forced:

- **through the whole guards stack** (supervisor, uid, rlimits, audit hook): the attack that got
  through before must now be refused, and the goal (a file read, a process killed, native code
  loaded) must not be reached;
- **with the audit hook bypassed** (the prelude replaced by one that just runs the program, as if
  native code had got past the hook): what the supervisor and the kernel still enforce (no
  descendant survives, the call returns on time, a root server's calls cannot signal it, read its
  environment or read each other's files).

Each attack is first shown to work outside the sandbox where that is not obvious. The tests that
depend on the server being root (a uid of its own per call) skip with the reason elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from rlf_envs.tasks.python_tool.sandbox import PythonSandbox, SandboxLimits, SandboxResult
from rlf_envs.tasks.python_tool.sandbox import runner as sandbox_runner

REPO = Path(__file__).resolve().parent.parent
NORMAL_CODE = "print(6 * 7)"
# runs the program without any rlimit or audit hook: "native code got past the guards"
BYPASS_PRELUDE = "import sys\nexec(compile(sys.stdin.read(), '<code>', 'exec'), {'__name__': '__main__'})\n"
STDLIB = Path(os.__file__).resolve().parent
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a uid of its own per call needs a root server")


def guards(**limits: Any) -> PythonSandbox:
    chosen = {"cpu_s": 2, "wall_s": 10, "memory_mb": 256, **limits}
    return PythonSandbox(SandboxLimits(**chosen), isolation="guards")


def run(code: str, sandbox: PythonSandbox | None = None) -> SandboxResult:
    """Run ``code`` and then a normal program on one guards sandbox; the normal one must print 42."""
    sandbox = sandbox or guards()

    async def both() -> tuple[SandboxResult, SandboxResult]:
        return await sandbox.run(code), await sandbox.run(NORMAL_CODE)

    attack, normal = asyncio.run(both())
    assert normal.ok and normal.stdout == "42\n", normal.to_text()
    assert sandbox.stats()["in_flight"] == 0
    return attack


@pytest.fixture()
def bypassed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace the prelude (rlimits + audit hook) by one that just runs the program."""
    monkeypatch.setattr(sandbox_runner, "PRELUDE_SOURCE", BYPASS_PRELUDE)


@pytest.fixture()
def marker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file outside every allowed root, readable by the server's user."""
    path = tmp_path_factory.mktemp("outside") / "secret.txt"
    path.write_text("rlf guards marker: outside the sandbox\n")
    return path


# --- holes closed in the audit hook ------------------------------------------------------------


def dir_fd_attack(target: str, flags: str) -> str:
    """Go deeper than the stdlib inside the working directory, then open ``target`` relative to a
    descriptor of the stdlib: the same '..' count lands inside the working directory from the cwd."""
    return (
        "import os\n"
        "std = os.path.realpath(os.path.dirname(os.__file__))\n"
        "depth = std.count('/')\n"
        "os.makedirs('d/' * (depth + 2))\n"
        "os.chdir('d/' * (depth + 2))\n"
        "fd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
        f"rel = '../' * depth + {target.lstrip('/')!r}\n"
        f"got = os.open(rel, {flags}, dir_fd=fd)\n"
        "print('opened', os.read(got, 200) if 'RDONLY' in "
        + repr(flags)
        + " else os.write(got, b'escaped'))\n"
    )


def test_os_open_relative_to_a_stdlib_descriptor_cannot_read_outside(marker: Path) -> None:
    attack = run(dir_fd_attack(str(marker), "os.O_RDONLY"))
    assert "guards marker" not in attack.stdout and "opened" not in attack.stdout, attack.to_text()
    assert "sandbox: os.open with a relative path may not contain '..'" in attack.to_text()


def test_os_open_relative_to_a_stdlib_descriptor_cannot_write_outside(tmp_path: Path) -> None:
    target = tmp_path / "written-by-the-sandbox.txt"
    attack = run(dir_fd_attack(str(target), "os.O_WRONLY | os.O_CREAT"))
    assert not target.exists() and "opened" not in attack.stdout, attack.to_text()
    assert "sandbox: os.open with a relative path may only read" in attack.to_text()


def test_relative_reads_still_work_where_the_hook_can_tell() -> None:
    code = (
        "import os, shutil\nos.makedirs('a/b')\nopen('a/b/f.txt', 'w').write('inside')\n"
        "fd = os.open('a', os.O_RDONLY)\nprint(os.read(os.open('b/f.txt', os.O_RDONLY, dir_fd=fd), 10))\n"
        "shutil.rmtree('a')\nprint(os.listdir('.'))"
    )
    result = run(code)
    assert result.stdout == "b'inside'\n[]\n", result.to_text()


def test_create_builtin_cannot_bring_back_a_removed_signal_function() -> None:
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = (
            "import _imp, importlib.machinery, os\n"
            "spec = importlib.machinery.BuiltinImporter.find_spec('_signal')\n"
            "fresh = _imp.create_builtin(spec)\n"
            f"fresh.pidfd_send_signal(os.pidfd_open({victim.pid}), 9)\n"
            "print('sent')"
        )
        attack = run(code)
        time.sleep(0.2)
        assert victim.poll() is None, "the program killed a process of the server's user"
        assert "sent" not in attack.stdout
        assert "module '_imp' has no attribute 'create_builtin'" in attack.to_text(), attack.to_text()
    finally:
        victim.kill()
        victim.wait()


def test_module_from_spec_cannot_recreate_posix_either() -> None:
    code = (
        "import importlib.machinery, importlib.util\n"
        "spec = importlib.machinery.BuiltinImporter.find_spec('posix')\n"
        "print(hasattr(importlib.util.module_from_spec(spec), 'chroot'))"
    )
    attack = run(code)
    assert "True" not in attack.stdout and "has no attribute 'create_builtin'" in attack.to_text()


def compiled_site_package() -> Path:
    found = sorted((STDLIB / "site-packages").glob("*.so"))
    if not found:
        pytest.skip(f"no compiled module directly in {STDLIB / 'site-packages'} to try")
    return found[0]


def test_compiled_third_party_packages_are_not_loadable() -> None:
    extension = compiled_site_package()
    name = extension.name.partition(".")[0]
    on_path = run(f"import sys\nsys.path.append({str(extension.parent)!r})\nimport {name}\nprint('loaded')")
    direct = run(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location({name!r}, {str(extension)!r})\n"
        "importlib.util.module_from_spec(spec)\nprint('loaded')"
    )
    for attack in (on_path, direct):
        assert "loaded" not in attack.stdout and not attack.ok, attack.to_text()
    assert "sandbox: loading the extension" in direct.to_text(), direct.to_text()


def test_a_denied_extension_cannot_be_loaded_under_another_package_name() -> None:
    extension = next((STDLIB / "lib-dynload").glob("_posixsubprocess*.so"), None)
    if extension is None:
        pytest.skip("_posixsubprocess is built into this interpreter")
    code = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('x._posixsubprocess', {str(extension)!r})\n"
        "print('fork_exec' in dir(importlib.util.module_from_spec(spec)))"
    )
    attack = run(code)
    assert "True" not in attack.stdout
    assert "sandbox: importing 'x._posixsubprocess' is not allowed" in attack.to_text(), attack.to_text()


def test_the_hook_helpers_cannot_be_rewritten_from_a_traceback() -> None:
    code = (
        "import sys\ntry:\n    open('/etc/passwd')\nexcept PermissionError as error:\n    tb = error.__traceback__\n"
        "while tb.tb_next:\n    tb = tb.tb_next\n"
        "helpers = [v for v in tb.tb_frame.f_locals.values() if callable(v) and hasattr(v, '__code__')]\n"
        "for helper in helpers:\n    helper.__code__ = (lambda *a, **k: None).__code__\n"
        "print(open('/etc/passwd').read())"
    )
    attack = run(code)
    assert "root:" not in attack.stdout and "own functions cannot be changed" in attack.to_text(), (
        attack.to_text()
    )


# --- the call's processes: uid, rlimits, descendants ------------------------------------------


@needs_root
def test_calls_run_as_distinct_unprivileged_uids_in_private_directories() -> None:
    sandbox = guards(wall_s=20)
    code = (
        "import os, time\nst = os.stat('.')\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), st.st_uid, oct(st.st_mode & 0o777))\ntime.sleep(1)"
    )

    async def together() -> list[SandboxResult]:
        return await asyncio.gather(*(sandbox.run(code) for _ in range(3)))

    results = asyncio.run(together())
    rows = [result.stdout.split(" ", 2) for result in results]
    uids = {int(uid) for uid, _, _ in rows}
    assert len(uids) == 3 and 0 not in uids, [r.to_text() for r in results]
    for uid, gid, rest in rows:
        assert gid == uid and rest.strip() == f"[] {uid} 0o700", rest
    assert sandbox.stats()["peak_in_flight"] == 3


@needs_root
def test_rlimit_nproc_holds_for_a_root_server() -> None:
    code = (
        "import threading, time\nthreading.stack_size(256 * 1024)\nstarted = 0\n"
        "try:\n    for _ in range(40):\n"
        "        threading.Thread(target=time.sleep, args=(2,), daemon=True).start()\n        started += 1\n"
        "except RuntimeError as error:\n    print(started, error)\nelse:\n    print(started, 'all started')"
    )
    attack = run(code, guards(processes=8))
    started, reason = attack.stdout.strip().split(" ", 1)
    assert int(started) < 8 and reason == "can't start new thread", attack.to_text()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("bypassed")
def test_a_detached_descendant_holding_the_pipes_dies_and_the_call_returns_on_time() -> None:
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
        "print('child', pid, flush=True)"
    )
    started = time.monotonic()
    result = asyncio.run(guards(wall_s=4).run(code))
    took = time.monotonic() - started
    child = int(result.stdout.split()[1])
    # a hang guard, not a speed test: before, the call lasted as long as the child (60 s)
    assert took < 4 + 10, f"the call took {took:.1f} s"
    assert result.ok and not Path(f"/proc/{child}").exists(), result.to_text()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("bypassed")
def test_a_detached_descendant_dies_at_the_wall_clock_limit_too() -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n    os._exit(0)\n"
        "print('parent', os.getpid(), flush=True)\ntime.sleep(60)"
    )
    started = time.monotonic()
    result = asyncio.run(guards(wall_s=3).run(code))
    took = time.monotonic() - started
    assert result.outcome.value == "wall_timeout" and took < 3 + 10, (took, result.to_text())
    parent = int(result.stdout.split()[1])
    assert not Path(f"/proc/{parent}").exists()
    assert not [p for p in Path("/proc").glob("[0-9]*") if _is_child_of(p, parent)]


def _is_child_of(proc: Path, parent: int) -> bool:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent
    except (OSError, IndexError, ValueError):
        return False


@needs_root
@pytest.mark.usefixtures("bypassed")
def test_past_the_hook_a_root_servers_call_cannot_signal_it_or_read_its_secrets(marker: Path) -> None:
    planted = REPO / f"rlf-guards-{os.getpid()}.txt"
    code = (
        "import os\n"
        f"for attempt in (lambda: os.kill({os.getpid()}, 0), lambda: open('/proc/{os.getpid()}/environ').read(),\n"
        f"                lambda: open({str(marker)!r}).read(), lambda: open('/etc/shadow').read(),\n"
        f"                lambda: open({str(planted)!r}, 'w').write('planted')):\n"
        "    try:\n        attempt()\n        print('reached')\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
    )
    assert Path(f"/proc/{os.getpid()}/environ").read_bytes()  # readable to the server's own user
    result = run(code)
    planted_exists = planted.exists()
    planted.unlink(missing_ok=True)
    assert result.stdout.split() == ["PermissionError"] * 5 and not planted_exists, result.to_text()


@needs_root
@pytest.mark.usefixtures("bypassed")
def test_past_the_hook_one_call_cannot_read_another_calls_files() -> None:
    sandbox = guards(wall_s=20)
    writer = "import os, time\nopen('secret.txt', 'w').write('call one')\nprint(os.getcwd(), flush=True)\ntime.sleep(6)"

    async def scenario() -> tuple[SandboxResult, SandboxResult]:
        first = asyncio.create_task(sandbox.run(writer))
        paths: list[str] = []
        for _ in range(100):  # until the first call has written its file (the test runs as root)
            await asyncio.sleep(0.05)
            paths = [str(path) for path in Path(sandbox.tmp_root or "/tmp").glob("rlf-sandbox-*/secret.txt")]
            if paths:
                break
        assert paths, "the first call wrote no file"
        reader = (
            f"for path in {paths!r}:\n    try:\n        print(open(path).read())\n"
            "    except OSError as error:\n        print(type(error).__name__)\n"
        )
        second = await sandbox.run(reader)  # while the first call still runs
        return await first, second

    first, second = asyncio.run(scenario())
    assert first.ok and "call one" not in second.stdout and "PermissionError" in second.stdout, (
        second.to_text()
    )


# --- the server says when auto fell back ---------------------------------------------------------


def test_auto_fallback_is_announced_in_the_instructions_and_stats() -> None:
    args = ["-m", "rlf_envs.tasks.python_tool.server", "--stats-tool", "--isolation", "auto", "--bwrap", "/nonexistent/bwrap"]  # fmt: skip
    params = StdioServerParameters(command=sys.executable, args=args, env={"PYTHONPATH": str(REPO)})

    async def scenario() -> tuple[str, dict[str, Any], str]:
        async with Client(params) as client:
            result = await client.call_tool("run_python", {"code": NORMAL_CODE})
            stats = (await client.call_tool("sandbox_stats", {})).structured_content
            return client.instructions or "", stats, result.content[0].text

    instructions, stats, text = asyncio.run(scenario())
    assert "isolation: guards" in instructions and "not a security boundary" in instructions
    assert "--isolation bwrap" in stats["warning"] and stats["sandbox_info"]["warning"] == stats["warning"]
    assert text == "42\n[exit code 0]"


@needs_root
def test_a_world_readable_interpreter_runs_as_the_call_uid_without_pinned_descriptors() -> None:
    system_python = Path("/usr/bin/python3")
    if not system_python.exists() or system_python.resolve() == Path(sys.executable).resolve():
        pytest.skip("no second, world-readable interpreter at /usr/bin/python3")
    version = subprocess.run([str(system_python), "-c", "import sys; print(sys.version_info >= (3, 11))"], capture_output=True, text=True)  # fmt: skip
    if version.stdout.strip() != "True":
        pytest.skip("/usr/bin/python3 is older than 3.11")
    sandbox = PythonSandbox(SandboxLimits(cpu_s=2), isolation="guards", python=str(system_python))
    code = (
        "import os, sys\nopen_fds = []\nfor fd in range(64):\n    try:\n        os.fstat(fd)\n"
        "        open_fds.append(fd)\n    except OSError:\n        pass\n"
        "print(os.getuid() != 0, sys.flags.isolated, open_fds)"
    )
    result = run(code, sandbox)
    assert result.stdout == "True 1 [0, 1, 2]\n", result.to_text()  # -I, and no pinned descriptors


def test_guards_mode_runs_code_and_reports_it() -> None:
    sandbox = PythonSandbox(SandboxLimits(cpu_s=2), isolation="guards")
    info = sandbox.info()
    assert info["isolation"] == "guards" and info["subreaper"] and "warning" not in info  # guards asked for
    assert ("host_uids" in info) == (os.geteuid() == 0)
    result = asyncio.run(sandbox.run(NORMAL_CODE))
    assert result.ok and result.stdout == "42\n"
    denied = asyncio.run(sandbox.run(f"print(open({str(REPO / 'README.md')!r}).read())"))
    assert (
        f"sandbox: reading '{REPO / 'README.md'}' is not allowed" in denied.to_text()
    )  # the guards still hold


def test_auto_falls_back_to_guards_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    missing = "/nonexistent/rlf-test/bwrap-auto"
    with caplog.at_level(logging.WARNING, logger="rlf_envs.isolation"):
        first = PythonSandbox(isolation="auto", bwrap_path=missing)
        PythonSandbox(isolation="auto", bwrap_path=missing)
    warnings = [r for r in caplog.records if "in-process guards only" in r.getMessage()]
    assert len(warnings) == 1 and first.info()["isolation"] == "guards"
    assert "not a security boundary" in first.info()["warning"] == first.warning
    assert asyncio.run(first.run(NORMAL_CODE)).stdout == "42\n"
