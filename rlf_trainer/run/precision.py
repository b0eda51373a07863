"""``mixed_precision: auto``: bf16 where the chip multiplies bf16 natively, fp32 elsewhere.

bf16 pays only where the hardware has bf16 arithmetic: CUDA devices that report it, and CPUs with
AVX512-BF16 or AMX (on a 2-core Intel Xeon VM with AMX, a bf16 matmul ran 4-7x an fp32 one).
Elsewhere torch emulates bf16 and runs far slower than fp32 (a 2-core AMD EPYC VM that exposed
AVX2 but no AVX-512, 2026-12-08: 1.2 GFLOP/s against 50.8 on one thread), so ``auto`` keeps fp32
there and :func:`emulated_bf16_warning` speaks up when bf16 is asked for by name. The answer comes
from the processor's own flags (``/proc/cpuinfo``), never from the model's name.

Example:
    >>> resolve_mixed_precision("auto", cuda_bf16=False, cpu_flags={"avx2", "avx512_bf16"})
    'bf16'
    >>> resolve_mixed_precision("auto", cuda_bf16=False, cpu_flags={"avx2", "avx512f"})
    'no'
    >>> resolve_mixed_precision("no", cuda_bf16=True, cpu_flags={"amx_bf16"})
    'no'
    >>> emulated_bf16_warning("bf16", "cpu", cpu_flags={"avx2"}) is not None
    True
"""

from __future__ import annotations

from pathlib import Path

NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def read_cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The first processor's feature flags (empty where the file does not exist, e.g. macOS)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / arm64
            return set(value.split())
    return set()


def cuda_has_bf16() -> bool:
    """A CUDA device is visible and does bf16 arithmetic (Ampere and newer)."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def resolve_mixed_precision(
    setting: str, *, cuda_bf16: bool | None = None, cpu_flags: set[str] | None = None
) -> str:
    """``auto`` -> ``bf16`` on a bf16-capable CUDA device or a CPU with native bf16, else ``no``;
    any other setting is returned as it is. ``cuda_bf16`` / ``cpu_flags`` default to this machine's."""
    if setting != "auto":
        return setting
    if cuda_bf16 if cuda_bf16 is not None else cuda_has_bf16():
        return "bf16"
    flags = read_cpu_flags() if cpu_flags is None else cpu_flags
    return "bf16" if flags & NATIVE_BF16_CPU_FLAGS else "no"


def emulated_bf16_warning(
    mixed_precision: str, device_type: str, *, cpu_flags: set[str] | None = None
) -> str | None:
    """What to tell a user who runs ``mixed_precision`` on a CPU that emulates bf16, or None.

    Only a bf16 run on a CPU whose flags lack native bf16 gets a message; ``auto`` never picks
    that, so it comes from a config or command line that named bf16.

    Example:
        >>> emulated_bf16_warning("bf16", "cpu", cpu_flags={"avx2", "amx_bf16"}) is None
        True
        >>> emulated_bf16_warning("bf16", "cuda", cpu_flags=set()) is None
        True
        >>> emulated_bf16_warning("no", "cpu", cpu_flags=set()) is None
        True
    """
    if device_type != "cpu" or mixed_precision != "bf16":
        return None
    flags = read_cpu_flags() if cpu_flags is None else cpu_flags
    if flags & NATIVE_BF16_CPU_FLAGS:
        return None
    return (
        f"mixed_precision={mixed_precision} on a CPU without native bf16 (no "
        f"{' or '.join(sorted(NATIVE_BF16_CPU_FLAGS))} among its flags): torch emulates it here, which "
        "runs far slower than fp32 (40x on a matmul on a 2-core AVX2 VM); "
        "mixed_precision=auto picks fp32 on this machine"
    )


__all__ = [
    "NATIVE_BF16_CPU_FLAGS",
    "read_cpu_flags",
    "cuda_has_bf16",
    "resolve_mixed_precision",
    "emulated_bf16_warning",
]
