"""Per-call limits of the python sandbox, and the rlimit arguments they become for the child.

Example:
    >>> limits = SandboxLimits(cpu_s=2, memory_mb=128)
    >>> limits.prelude_args()[:3]
    ['2', '134217728', '16777216']
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


class SandboxConfigError(ValueError):
    """A sandbox limit or option is out of range."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one ``run_python`` call may use.

    Attributes:
        cpu_s: CPU seconds (RLIMIT_CPU; rounded up to whole seconds): SIGXCPU past it.
        memory_mb: address space (RLIMIT_AS); an allocation past it raises MemoryError.
        output_chars: characters of stdout + stderr kept; past it the process is killed.
        wall_s: wall-clock seconds before the whole process group is killed (sleeping or
            blocked code uses no CPU, so the CPU limit alone would not end it).
        file_size_mb: largest file the program may write (RLIMIT_FSIZE).
        disk_mb: under bwrap, the size of the private tmpfs that holds ``/tmp`` and the working
            directory, so all of a call's files together (guards mode has no such bound).
        open_files: file descriptors (RLIMIT_NOFILE).
        processes: RLIMIT_NPROC (processes and threads of the user; not enforced for root).
        code_chars: longest program accepted.
    """

    cpu_s: float = 5.0
    memory_mb: int = 256
    output_chars: int = 8000
    wall_s: float = 10.0
    file_size_mb: int = 16
    disk_mb: int = 64
    open_files: int = 64
    processes: int = 64
    code_chars: int = 100_000

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or value <= 0:
                raise SandboxConfigError(
                    f"sandbox limit {field.name} must be a positive number, got {value!r}"
                )
        if self.memory_mb < 32:
            raise SandboxConfigError(
                f"memory_mb={self.memory_mb} is too small for the interpreter to start (>= 32)"
            )
        if self.open_files < 16:
            raise SandboxConfigError(f"open_files={self.open_files} is too small for the interpreter (>= 16)")

    @property
    def cpu_whole_s(self) -> int:
        """RLIMIT_CPU counts whole seconds."""
        return max(1, math.ceil(self.cpu_s))

    def prelude_args(self) -> list[str]:
        """The ``CPU_S MEMORY_BYTES FILE_BYTES OPEN_FILES PROCESSES`` arguments of the child's prelude."""
        return [
            str(self.cpu_whole_s),
            str(int(self.memory_mb) * 1024 * 1024),
            str(int(self.file_size_mb) * 1024 * 1024),
            str(int(self.open_files)),
            str(int(self.processes)),
        ]
