"""``rlf-bench floor --config X.yaml``: how much faster bf16 could make a step, bounded by its kernels.

Runs trainer steps of the config at ``--precision`` (default ``no``: fp32) in two processes with the
same seed, so both play the same episodes (the report checks it by the rewards): one timed as
``rlf-bench train`` times it, one recording every matmul and attention kernel call with its operands'
shapes, strides and dtypes (a ``TorchDispatchMode``; the recording slows that run, whose times are
not used). Each recorded kernel is then replayed alone, unprofiled, on random operands of the same
layout, as recorded and in bf16, and the report gives per phase (generation, update):

- the wall time, and its kernels' own time (the rest is everything else a step does: norms,
  activations, casts, sampling, the optimizer, tool calls, Python);
- the **bf16 floor**: each kernel call at the faster of its bf16 and recorded replay times. A bf16
  step of the same batch runs at least these kernels (autocast runs the same matmuls in bf16), so
  ``wall / bf16 floor`` of an fp32 run bounds bf16's speed-up from above, whatever else got faster;
- for the update, its FLOPs as ``rlf-bench train`` counts them over the bf16 floor of its matmuls
  alone: the highest share of the bf16 matmul peak an update made of nothing but them could show.

Replayed alone, a kernel finds its operands in cache more often than inside a step, and the floor
leaves out every other op (norms, casts, sampling, the optimizer, Python): the floors are optimistic
and the bounds loose, never too tight. ``torch.profiler`` cannot give them: it lengthens the kernels
it times (docs/benchmarks.md). A bound holds for these kernels (torch's CPU matmuls and flash
attention on this machine); other kernels would need their own replay.

Example:
    rlf-bench floor --config examples/configs/deepsearch_smollm2_grpo_cpu.yaml --steps 3 model.path=...
    rlf-bench floor --config examples/configs/deepsearch_smollm2_grpo_cpu.yaml --precision bf16 model.path=...
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "mv", "addmv"})
ATTENTION = frozenset(
    {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"}
)
_LOGSUMEXP_ARG = 5  # the flash backward's fp32 log-sum-exp stays fp32 whatever the inputs' dtype


@dataclass(frozen=True)
class TensorLayout:
    """What a kernel's timing depends on in one operand: its shape, strides and dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def materialise(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A tensor of this layout (``dtype`` in place of a floating one's own): random values, or
        ones (a boolean mask that lets every position through; these kernels' time does not
        depend on the values)."""
        dtype = dtype if dtype is not None and self.dtype.is_floating_point else self.dtype
        size = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True)) if self.shape else 1
        storage = torch.randn(size, dtype=dtype) if dtype.is_floating_point else torch.ones(size, dtype=dtype)
        return storage.as_strided(self.shape, self.stride)


def _layout(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorLayout(tuple(value.shape), tuple(value.stride()), value.dtype)
    return value


@dataclass(frozen=True)
class KernelCall:
    """One kind of kernel call: the op, its operands' layouts and its other arguments."""

    phase: str
    op: Any  # a torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]

    def prepare(self, dtype: torch.dtype | None) -> Callable[[], Any]:
        """A call of the op on operands of the recorded layouts, made once (``dtype``: the floating
        operands', None: as recorded)."""
        args = [
            a.materialise(None if (self.is_attention and i == _LOGSUMEXP_ARG) else dtype)
            if isinstance(a, TensorLayout)
            else a
            for i, a in enumerate(self.args)
        ]
        kwargs = {k: v.materialise(dtype) if isinstance(v, TensorLayout) else v for k, v in self.kwargs}
        op = self.op
        return lambda: op(*args, **kwargs)

    @property
    def is_attention(self) -> bool:
        return self.op.overloadpacket.__name__ in ATTENTION


class KernelRecorder(TorchDispatchMode):
    """Counts the matmul and attention kernel calls run under it, by :class:`KernelCall`, tagged
    with the current ``phase``.

    Example:
        >>> recorder = KernelRecorder()
        >>> with recorder:
        ...     _ = torch.ones(4, 8) @ torch.ones(8, 2) + torch.ones(4, 2)
        >>> [(call.op.overloadpacket.__name__, count) for call, count in recorder.calls.items()]
        [('mm', 1)]
    """

    def __init__(self) -> None:
        super().__init__()
        self.phase = "update"
        self.calls: Counter[KernelCall] = Counter()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in MATMULS or name in ATTENTION:
            layouts = tuple(_layout(a) for a in args)
            keyed = tuple(sorted((k, _layout(v)) for k, v in kwargs.items()))
            self.calls[KernelCall(self.phase, func, layouts, keyed)] += 1
        return func(*args, **kwargs)


def replay_seconds(call: KernelCall, dtype: torch.dtype | None, repeats: int = 3) -> float:
    """The fastest of ``repeats`` timed calls of ``call`` alone (after one untimed), in ``dtype``."""
    run = call.prepare(dtype)
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def kernel_floors(calls: Counter[KernelCall], steps: int) -> dict[str, dict[str, float]]:
    """Per phase and per step: kernel calls, their replay time as recorded, their bf16 floor (each
    call at the faster of bf16 and as recorded) and that floor's matmuls alone.

    Example:
        >>> recorder = KernelRecorder()
        >>> with recorder:
        ...     _ = torch.randn(64, 64) @ torch.randn(64, 64)
        >>> floors = kernel_floors(recorder.calls, steps=1)["update"]
        >>> floors["calls"], floors["bf16_floor_s"] <= floors["kernels_s"]
        (1.0, True)
    """
    out: dict[str, dict[str, float]] = {}
    for call, count in calls.items():
        recorded = replay_seconds(call, None)
        try:
            bf16 = replay_seconds(call, torch.bfloat16)
        except RuntimeError:  # a layout this kernel has no bf16 path for: it stays as it was
            bf16 = recorded
        phase = out.setdefault(
            call.phase, dict.fromkeys(("calls", "kernels_s", "bf16_floor_s", "matmul_bf16_floor_s"), 0.0)
        )
        phase["calls"] += count / steps
        phase["kernels_s"] += count * recorded / steps
        phase["bf16_floor_s"] += count * min(recorded, bf16) / steps
        if not call.is_attention:
            phase["matmul_bf16_floor_s"] += count * min(recorded, bf16) / steps
    return out


def record_config(
    config: str, precision: str, steps: int, overrides: list[str]
) -> tuple[Counter[KernelCall], list[Any]]:
    """``steps`` trainer steps of ``config`` at ``precision``, the kernels of all but the first recorded (the
    GRPO update's as ``update``, the rest of a GRPO step as ``generation``); and each step's
    reward (GRPO) or loss (SFT), as ``rlf-bench train`` reports them."""
    from rlf_bench.speed_bench import bench_overrides
    from rlf_trainer.algorithms import grpo
    from rlf_trainer.config import load_config
    from rlf_trainer.trainer import Trainer

    trainer = Trainer(
        load_config(config, [*overrides, *bench_overrides(precision, steps, tempfile.mkdtemp())])
    )
    recorder = KernelRecorder()
    grpo_update = grpo.update
    grpo_config = trainer.sft_data is None

    def tagged_update(*args: Any, **kwargs: Any) -> Any:
        recorder.phase = "update"
        try:
            return grpo_update(*args, **kwargs)
        finally:
            recorder.phase = "generation"

    grpo.update = tagged_update  # type: ignore[assignment]  (train_step looks it up at each call)
    rewards = []
    try:
        for step in range(steps):
            recorder.phase = "generation" if grpo_config else "update"
            if step == 0:  # warm-up, as in rlf-bench train: not in the figures
                record = trainer.train_step()
            else:
                with recorder:
                    record = trainer.train_step()
            rewards.append(record.get("reward/mean", record.get("sft/loss")))
    finally:
        grpo.update = grpo_update  # type: ignore[assignment]
        trainer.close()
    return recorder.calls, rewards


def floor_report(config: str, precision: str, steps: int, overrides: list[str]) -> dict[str, Any]:
    """The timed run (a child process, as ``rlf-bench train`` runs it), the recorded one here,
    the replayed kernels' floors and the bounds they give (see the module doc)."""
    from rlf_bench.speed_bench import matmul_peak_gflops, run_precision_bench

    runs = run_precision_bench(config, [precision], steps, tempfile.mkdtemp(), overrides)["runs"]
    timed = runs[precision]
    calls, rewards = record_config(config, precision, steps, overrides)
    floors = kernel_floors(calls, steps=max(1, steps - 1))
    peak = matmul_peak_gflops("bfloat16")
    phases: dict[str, Any] = {}
    for phase, floor in floors.items():
        wall = timed[phase]["seconds"] if phase in timed else timed["step_s"]
        phases[phase] = floor | {
            "wall_s": wall,
            "speedup_bound": wall / max(floor["bf16_floor_s"], 1e-9),
        }
    update = timed["update"]
    flops = update["gflops"] * 1e9 * update["seconds"]
    matmul_floor = floors.get("update", {}).get("matmul_bf16_floor_s", 0.0)
    total_floor = sum(f["bf16_floor_s"] for f in floors.values())
    return {
        "config": config,
        "precision": timed["precision"],
        "steps": steps,
        "threads": torch.get_num_threads(),
        "same_episodes": rewards == timed["reward_mean"],
        "bf16_matmul_peak_gflops": peak,
        "step_s": timed["step_s"],
        "phases": phases,
        "step_speedup_bound": timed["step_s"] / max(total_floor, 1e-9),
        "update_peak_share_bound": flops / matmul_floor / 1e9 / peak if matmul_floor else None,
    }


def format_floor(report: dict[str, Any]) -> str:
    """A table: per phase, the wall time, its kernels' time, the bf16 floor and the bound."""
    lines = [
        f"rlf-bench floor --config {report['config']}: {report['steps']} steps at mixed_precision="
        f"{report['precision']} (first one a warm-up), "
        f"{report['threads']} threads; the timed and the recorded run played the same episodes: "
        f"{'yes' if report['same_episodes'] else 'NO (the bound compares different batches)'}",
        f"{'phase':<12}{'kernel calls':>13}{'wall s':>9}{'kernels s':>11}{'bf16 floor s':>13}{'bound':>8}",
    ]
    for phase, f in report["phases"].items():
        lines.append(
            f"{phase:<12}{f['calls']:>13.0f}{f['wall_s']:>9.2f}{f['kernels_s']:>11.2f}"
            f"{f['bf16_floor_s']:>13.2f}{f['speedup_bound']:>7.2f}x"
        )
    lines.append(
        f"step: {report['step_s']:.2f} s; with bf16 kernels it can be at most {report['step_speedup_bound']:.2f}x "
        "faster (these kernels, each replayed alone)"
    )
    if report["update_peak_share_bound"] is not None:
        lines.append(
            f"update: at most {report['update_peak_share_bound']:.0%} of the bf16 matmul peak "
            f"({report['bf16_matmul_peak_gflops']:.0f} GFLOP/s) if it ran nothing but its matmuls"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from rlf_bench.speed_bench import config_bench_args

    args = config_bench_args(
        "rlf-bench floor",
        __doc__,
        argv,
        precision="no",
        steps=3,
        steps_help="trainer steps, the first a warm-up",
    )
    report = floor_report(args.config, args.precision, args.steps, args.overrides)
    print(format_floor(report) + (f"\n{json.dumps(report)}" if args.json else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
