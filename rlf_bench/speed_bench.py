"""``rlf-bench train --config X.yaml``: the trainer's speed against this machine's limit, per precision.

For each precision asked (default ``no`` then ``bf16``; ``no`` alone where the chip would emulate
bf16, which runs far slower than fp32: see :mod:`rlf_trainer.run.precision`; ``--precisions no
bf16`` runs it anyway), a fresh process runs ``--steps`` trainer
steps of the config (GRPO or SFT, no eval, no checkpoint) and reports per phase:

- **generation** (GRPO only, the rollout's wall time, tool calls included): generated tokens/s, and GFLOP/s counted as
  ``2 x body params x every token of the batch's sequences + 2 x head params x generated tokens``
  (each token passes the body once with the prefix cache; the vocabulary projection runs only where
  a token is sampled);
- **update**: trained tokens/s, and GFLOP/s counted as ``6 x body params x forwarded tokens +
  6 x head params x trained tokens`` (forward and backward; forwarded: the real tokens the model
  ran over, a micro-batch's shared prefix once, ``update/tokens``; the projection runs only on
  trained positions); attention's own FLOPs are left out, so the figures are a lower bound;
- the fraction of this machine's **matmul peak** for the dtype in use, measured first in the same
  run (a ``[1024, 576] @ [576, 1536]`` matmul, SmolLM2-135M's MLP shape, on the same threads);
- the step time, the process's peak RSS and its malloc (`rlf_trainer.run.allocator`: the child re-executes
  itself with tcmalloc preloaded where one is installed, as `rlf-train` does).

The first step is a warm-up and is left out of the figures when there are several.

Example:
    rlf-bench train --config examples/configs/deepsearch_smollm2_grpo_cpu.yaml --steps 3
    rlf-bench train --config examples/configs/smollm2_learn_cpu.yaml --precisions no bf16 --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MATMUL_SHAPE = (1024, 576, 1536)  # (m, k, n)


def matmul_peak_gflops(dtype_name: str, seconds: float = 1.0) -> float:
    """GFLOP/s of a ``[m, k] @ [k, n]`` matmul in ``dtype_name`` (``float32`` / ``bfloat16``) here, now.

    Example:
        >>> matmul_peak_gflops("float32", seconds=0.05) > 0
        True
    """
    import torch

    m, k, n = MATMUL_SHAPE
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    for _ in range(3):  # warm-up: kernels chosen, caches filled
        a @ b
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        count += 1
    return 2 * m * k * n * count / (time.perf_counter() - started) / 1e9


def phase_figures(records: list[dict[str, float]], body: int, head: int, peak: float) -> dict[str, Any]:
    """Tokens/s, GFLOP/s and share of ``peak`` per phase from a run's step metrics (see the module doc).

    Example:
        >>> step = {"time/step": 2.0, "time/generate": 1.0, "time/train": 0.5, "rollout/tokens": 100.0,
        ...         "rollout/generated_tokens": 10.0, "update/tokens": 100.0}
        >>> figures = phase_figures([step], body=1000, head=10, peak=1.0)
        >>> figures["generation"]["gflops"], figures["update"]["tokens_per_s"]
        (0.0002002, 20.0)
    """
    timed = records[1:] if len(records) > 1 else records

    def total(key: str) -> float:
        return sum(r.get(key, 0.0) for r in timed)

    out: dict[str, Any] = {"step_s": total("time/step") / len(timed)}
    # the rollout's wall time: an async rollout's time/generate sums its overlapping episodes' seconds
    rollout_s = total("time/rollout") or total("time/generate")
    if rollout_s:
        flops = 2 * body * total("rollout/tokens") + 2 * head * total("rollout/generated_tokens")
        gflops = flops / rollout_s / 1e9
        out["generation"] = {
            "seconds": rollout_s / len(timed),
            "tokens_per_s": total("rollout/generated_tokens") / rollout_s,
            "gflops": round(gflops, 7),
            "of_peak": gflops / peak,
        }
    train_s = total("time/train") or total("time/step")  # an SFT step is all update
    trained = total("rollout/generated_tokens") or total("sft/tokens")
    flops = 6 * body * total("update/tokens") + 6 * head * trained
    gflops = flops / train_s / 1e9
    out["update"] = {
        "seconds": train_s / len(timed),
        "tokens_per_s": trained / train_s,
        "gflops": round(gflops, 7),
        "of_peak": gflops / peak,
        "pad_fraction": sum(r.get("update/pad_fraction", 0.0) for r in timed) / len(timed),
    }
    return out


def config_bench_args(
    prog: str,
    doc: str,
    argv: list[str] | None,
    *,
    precision: str,
    steps: int,
    steps_help: str,
    flags: dict[str, str] | None = None,
) -> argparse.Namespace:
    """``argv`` of an ``rlf-bench`` command that runs trainer steps of a config: ``--config`` (an
    existing file), ``--precision``, ``--steps`` (at least 2: the first is a warm-up), ``--json``,
    the on/off ``flags`` (name: help) and ``dotted.key=value`` overrides; a usage error otherwise."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--precision", default=precision, choices=["no", "bf16", "auto"])
    parser.add_argument("--steps", type=int, default=steps, help=steps_help)
    for flag, text in (flags or {}).items():
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, as for rlf-train")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first is a warm-up)")
    if not Path(args.config).is_file():
        parser.error(f"no config file {args.config}")
    return args


def bench_overrides(precision: str, steps: int, workdir: Path | str) -> list[str]:
    """What a bench run of trainer steps sets last: the precision and step count, its own run
    folder, and no progress bar, eval or checkpoint (they would be timed with the steps)."""
    return [f"mixed_precision={precision}", f"max_steps={steps}", f"logging.dir={workdir}",
            f"logging.run_name=speed_{precision}", "logging.progress_bar=false", "eval.every=0",
            "checkpoint.every=0", "checkpoint.save_final=false", "checkpoint.save_model=false",
            "checkpoint.resume=none"]  # fmt: skip


def run_one(config: str, precision: str, steps: int, workdir: Path, overrides: list[str]) -> dict[str, Any]:
    """``steps`` trainer steps of ``config`` at ``precision`` in this process; its figures."""
    from rlf_trainer.config import load_config
    from rlf_trainer.run.allocator import loaded_allocator
    from rlf_trainer.trainer import Trainer

    trainer = Trainer(load_config(config, [*overrides, *bench_overrides(precision, steps, workdir)]))
    records: list[dict[str, float]] = []
    try:
        for _ in range(steps):
            records.append(trainer.train_step())
        model = trainer.accelerator.unwrap_model(trainer.model)
        head = model.get_output_embeddings().weight.numel()
        body = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
        dtype = "bfloat16" if trainer.config.mixed_precision == "bf16" else "float32"
    finally:
        trainer.close()
    peak = matmul_peak_gflops(dtype)
    return {
        "precision": trainer.config.mixed_precision,
        "matmul_peak_gflops": peak,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
        "allocator": Path(loaded_allocator()).name,
        "reward_mean": [r.get("reward/mean", r.get("sft/loss")) for r in records],
        **phase_figures(records, body, head, peak),
    }


def run_precision_bench(
    config: str, precisions: list[str], steps: int, workdir: Path, overrides: list[str]
) -> dict[str, Any]:
    """Each precision in its own process (its own peak RSS, its own Accelerate state), one after the other."""
    runs = {}
    for precision in precisions:
        command = [sys.executable, "-m", "rlf_bench.speed_bench", "--one", precision, "--config", config,
                   "--steps", str(steps), "--workdir", str(workdir), *overrides]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
        if done.returncode != 0:
            raise RuntimeError(f"the {precision} run failed:\n{done.stderr[-3000:]}")
        runs[precision] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"config": config, "steps": steps, "threads": _threads(), "runs": runs}


def default_precisions(native_bf16: bool) -> tuple[list[str], str | None]:
    """The precisions to compare when none are asked, and a note when bf16 is left out.

    Example:
        >>> default_precisions(True)
        (['no', 'bf16'], None)
        >>> default_precisions(False)[0]
        ['no']
    """
    if native_bf16:
        return ["no", "bf16"], None
    return ["no"], (
        "bf16 left out: this machine has no native bf16 (no CUDA device with it, no avx512_bf16 or amx_bf16 "
        "among the CPU's flags), where torch emulates it far slower than fp32; --precisions no bf16 runs it anyway"
    )


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def format_precision_report(report: dict[str, Any]) -> str:
    """A table: one row per precision and phase."""
    lines = [
        f"rlf-bench train --config {report['config']}: {report['steps']} steps per precision "
        f"(first one a warm-up), {report['threads']} threads",
        f"{'precision':<10}{'phase':<12}{'s/step':>8}{'tokens/s':>10}{'GFLOP/s':>9}{'of peak':>9}{'peak':>8}",
    ]
    for precision, run in report["runs"].items():
        for phase in ("generation", "update"):
            if phase in run:
                f = run[phase]
                lines.append(
                    f"{precision:<10}{phase:<12}{f['seconds']:>8.1f}{f['tokens_per_s']:>10.1f}"
                    f"{f['gflops']:>9.1f}{f['of_peak']:>9.0%}{run['matmul_peak_gflops']:>8.0f}"
                )
        lines.append(
            f"{precision:<10}{'step':<12}{run['step_s']:>8.1f}   peak RSS {run['peak_rss_gb']:.1f} GB, "
            f"malloc: {run.get('allocator', 'system')}"
        )
    runs = list(report["runs"].values())
    if len(runs) == 2:
        lines.append(f"speed-up of the step, {runs[1]['precision']} over {runs[0]['precision']}: "
                     f"{runs[0]['step_s'] / runs[1]['step_s']:.2f}x")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlf-bench train --config", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=None,
        choices=["no", "bf16", "fp16", "auto"],
        help="default: no bf16 (no alone where the chip would emulate bf16)",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="where the runs go (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process of one precision
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, as for rlf-train")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    import tempfile

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rlf-speed-"))
    if args.one:
        if argv is None:  # as rlf-train runs: with a caching malloc where one is installed
            from rlf_trainer.run.allocator import relaunch_with_fast_allocator

            relaunch_with_fast_allocator()
        print(json.dumps(run_one(args.config, args.one, args.steps, workdir, args.overrides)), flush=True)
        return 0
    precisions = args.precisions
    if precisions is None:
        from rlf_trainer.run.precision import resolve_mixed_precision

        precisions, note = default_precisions(resolve_mixed_precision("auto") == "bf16")
        if note:
            print(note, flush=True)
    report = run_precision_bench(args.config, precisions, args.steps, workdir, args.overrides)
    print(format_precision_report(report) + (f"\n{json.dumps(report)}" if args.json else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
