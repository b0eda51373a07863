"""A caching malloc for CPU training: the command re-executes itself with tcmalloc preloaded.

Why: glibc hands every freed block above its mmap threshold (32 MiB at most) back to the kernel, so
each new large tensor (the tied embedding's ``[49152, 576]`` gradient, a long micro-batch's
activations) is mapped afresh and zeroed page by page on first touch. In the DeepSearch recipe's
bf16 update one zero fill of that gradient took 80 ms (113 MB); with tcmalloc, which keeps freed
memory for reuse, the forward and backward of one group's micro-batch fell from 8.7 to 5.1 s
(fp32: 10.3 to 7.0 s; docs/benchmarks.md). vLLM's CPU backend preloads tcmalloc for its workers for
the same reason. A malloc can only be swapped before a process starts, hence the re-exec; only the
command-line entry points do it (``rlf-train``, ``rlf-eval``, ``examples/train.py``, ``rlf-serve``'s
HF backend), never an import. Processes started with the command's environment inherit
``LD_PRELOAD`` (a vLLM engine core in its own process, for one).

``RLF_MALLOC``: unset or ``auto`` finds tcmalloc (Debian: ``apt-get install libtcmalloc-minimal4``),
then jemalloc, on machines without an NVIDIA GPU (measured on CPUs only: a GPU run keeps its malloc
until measured there); ``system`` keeps glibc's; a path names the library to preload, anywhere.

Example:
    >>> find_fast_allocator({"RLF_MALLOC": "system"}) is None
    True
    >>> preloaded_allocator({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"})
    '/usr/lib/libjemalloc.so.2'
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# where Debian, Fedora, conda and vLLM's wheels put them, best first
_SEARCH = (
    "/usr/lib/*-linux-gnu/libtcmalloc_minimal.so.*",
    "/usr/lib64/libtcmalloc_minimal.so.*",
    "/usr/lib/libtcmalloc_minimal.so.*",
    "{prefix}/lib/libtcmalloc_minimal.so*",
    "{site}/vllm/libs/libtcmalloc_minimal*.so*",
    "/usr/lib/*-linux-gnu/libtcmalloc.so.*",
    "/usr/lib/*-linux-gnu/libjemalloc.so.*",
    "/usr/lib64/libjemalloc.so.*",
    "{prefix}/lib/libjemalloc.so*",
)
_NAMES = ("libtcmalloc", "libjemalloc")
_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one folder per GPU where the driver is loaded
RELAUNCHED = "RLF_MALLOC_RELAUNCHED"  # set in the re-executed process: never re-exec twice


class AllocatorError(ValueError):
    """``RLF_MALLOC`` names a library that does not exist."""


def _is_caching_malloc(path: str) -> bool:
    return any(name in Path(path).name for name in _NAMES)


def preloaded_allocator(env: Mapping[str, str]) -> str | None:
    """The tcmalloc or jemalloc entry of ``env``'s ``LD_PRELOAD``, if any."""
    entries = env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
    return next((entry for entry in entries if _is_caching_malloc(entry)), None)


def find_fast_allocator(
    env: Mapping[str, str], patterns: Sequence[str] = _SEARCH, gpus: str = _NVIDIA_GPUS
) -> str | None:
    """The library to preload: ``RLF_MALLOC``'s path, else the first of ``patterns`` found (tcmalloc
    before jemalloc) where the NVIDIA driver lists no GPU under ``gpus``; None with
    ``RLF_MALLOC=system`` or where none is installed."""
    setting = env.get("RLF_MALLOC", "auto").strip() or "auto"
    if setting == "system":
        return None
    if setting != "auto":
        if not Path(setting).is_file():
            raise AllocatorError(f"RLF_MALLOC={setting!r}: no such library (a path, 'auto' or 'system')")
        return setting
    if Path(gpus).is_dir() and any(Path(gpus).iterdir()):
        return None
    site = next((p for p in sys.path if p.endswith("site-packages")), "")
    for pattern in patterns:
        found = sorted(glob.glob(pattern.format(prefix=sys.prefix, site=site)))
        if found:
            return found[0]
    return None


def relaunch_with_fast_allocator(env: Mapping[str, str] | None = None) -> None:
    """Re-execute this command (``sys.orig_argv``) with a caching malloc preloaded, on Linux, unless
    one is loaded already or none is installed; returns only when it does not re-execute. A wrong
    ``RLF_MALLOC`` is reported on stderr and the command goes on with glibc's malloc."""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux") or env.get(RELAUNCHED) or preloaded_allocator(env):
        return
    try:
        library = find_fast_allocator(env)
    except AllocatorError as exc:
        print(f"warning: {exc}; using the system malloc", file=sys.stderr)
        return
    if library is None:
        return
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    env[RELAUNCHED] = library
    # tcmalloc reports every allocation over 1 GiB on stderr; a run's logits chunks can be that large
    env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError as exc:  # e.g. no exec permission: the command still runs, on glibc's malloc
        print(f"warning: could not re-execute with {library} preloaded ({exc})", file=sys.stderr)


def loaded_allocator() -> str:
    """The malloc this process runs on: the tcmalloc/jemalloc library mapped into it, or ``system``."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "system"
    paths = (line.split()[-1] for line in maps.splitlines() if line.strip())
    return next((path for path in paths if _is_caching_malloc(path)), "system")


__all__ = [
    "RELAUNCHED",
    "AllocatorError",
    "find_fast_allocator",
    "loaded_allocator",
    "preloaded_allocator",
    "relaunch_with_fast_allocator",
]
