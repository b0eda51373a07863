"""rlf_trainer.run.allocator: the entry points re-execute themselves with a caching malloc preloaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlf_trainer.run.allocator import (
    RELAUNCHED,
    AllocatorError,
    find_fast_allocator,
    preloaded_allocator,
)

# prints the marker before and after the relaunch: a re-exec prints "start" twice
_SCRIPT = """
import os, sys
from rlf_trainer.run.allocator import RELAUNCHED, loaded_allocator, relaunch_with_fast_allocator
print("start", os.environ.get(RELAUNCHED), sys.argv[1:], flush=True)
relaunch_with_fast_allocator()
print("after", os.environ.get(RELAUNCHED), os.environ.get("LD_PRELOAD"), loaded_allocator(), flush=True)
"""


def _run(tmp_path: Path, **env: str) -> list[str]:
    script = tmp_path / "relaunch.py"
    script.write_text(_SCRIPT)
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", RELAUNCHED, "RLF_MALLOC")}
    done = subprocess.run(
        [sys.executable, str(script), "--flag", "value"],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_search_takes_tcmalloc_before_jemalloc(tmp_path: Path) -> None:
    for name in ("libjemalloc.so.2", "libtcmalloc_minimal.so.4"):
        (tmp_path / name).write_bytes(b"")
    patterns = (f"{tmp_path}/libtcmalloc_minimal.so.*", f"{tmp_path}/libjemalloc.so.*")
    assert find_fast_allocator({}, patterns) == f"{tmp_path}/libtcmalloc_minimal.so.4"
    assert find_fast_allocator({}, patterns[1:]) == f"{tmp_path}/libjemalloc.so.2"
    assert find_fast_allocator({}, (f"{tmp_path}/none.so",)) is None
    assert find_fast_allocator({"RLF_MALLOC": "system"}, patterns) is None
    gpus = tmp_path / "gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)  # as the NVIDIA driver lists a GPU
    assert find_fast_allocator({}, patterns, gpus=str(gpus)) is None  # unmeasured on GPUs
    lib = f"{tmp_path}/libjemalloc.so.2"
    assert find_fast_allocator({"RLF_MALLOC": lib}, patterns, gpus=str(gpus)) == lib  # asked for: anywhere
    with pytest.raises(AllocatorError, match="RLF_MALLOC='/no/such.so'"):
        find_fast_allocator({"RLF_MALLOC": "/no/such.so"}, patterns)


def test_an_allocator_already_preloaded_is_recognised() -> None:
    assert preloaded_allocator({"LD_PRELOAD": "/x/libgomp.so:/usr/lib/libtcmalloc_minimal.so.4"}) == (
        "/usr/lib/libtcmalloc_minimal.so.4"
    )
    assert preloaded_allocator({"LD_PRELOAD": "/x/libgomp.so"}) is None
    assert preloaded_allocator({}) is None


def test_the_command_runs_again_once_with_the_library_preloaded(tmp_path: Path) -> None:
    # any loadable library shows the mechanism; libc is on every Linux machine
    libc = next(Path(p) for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6") if Path(p).exists())  # fmt: skip
    lines = _run(tmp_path, RLF_MALLOC=str(libc), LD_PRELOAD="")
    assert lines == [
        "start None ['--flag', 'value']",
        f"start {libc} ['--flag', 'value']",  # the same command line, re-executed
        f"after {libc} {libc} system",  # once: the marker stops a second re-exec
    ]


def test_system_or_a_missing_library_keeps_glibc(tmp_path: Path) -> None:
    assert _run(tmp_path, RLF_MALLOC="system") == ["start None ['--flag', 'value']", "after None None system"]
    script = tmp_path / "relaunch.py"
    done = subprocess.run(
        [sys.executable, str(script)],
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"} | {"RLF_MALLOC": "/no/such.so"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "after None None system" in done.stdout
    assert "RLF_MALLOC='/no/such.so': no such library" in done.stderr


def test_tcmalloc_is_found_and_mapped_where_it_is_installed(tmp_path: Path) -> None:
    library = find_fast_allocator({"RLF_MALLOC": "auto"})
    if library is None or "tcmalloc" not in library:
        pytest.skip("libtcmalloc-minimal4 is not installed (scripts/_system_deps.sh installs it)")
    start, relaunched, after = _run(tmp_path)
    assert relaunched == f"start {library} ['--flag', 'value']"
    assert Path(after.split()[-1]).resolve() == Path(library).resolve()  # the process's own maps
