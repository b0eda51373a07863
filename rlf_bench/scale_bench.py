"""``rlf-bench train --num-processes N``: our trainer on 1 process and on N processes, same global batch.

Each run is a real launch (``torchrun --standalone`` of ``rlf-bench train --only rlf``; on a
machine without a GPU the workers join a gloo process group), each process playing ``prompts / N``
of a step's prompts; the batch shape, model, env and seed are the ones ``rlf-bench train`` uses. Reported per process count: the step times (the first step is a
warm-up and untimed), samples/s and generated tokens/s (every process's tokens, over the wall
clock of rank 0). Each worker runs one torch thread, so 2 processes use 2 cores where 1 uses 1.

Example:
    rlf-bench train --num-processes 2 --prompts 4 --generations 4 --steps 4 --json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def run_launch(
    processes: int, shape: dict[str, int], model_dir: str | os.PathLike[str], workdir: Path
) -> dict[str, Any]:
    """``rlf-bench train --only rlf`` on ``processes`` processes (a torchrun launch even for 1: the same start-up)."""
    if shape["prompts"] % processes:
        raise ValueError(f"--prompts {shape['prompts']} must be a multiple of --num-processes {processes}")
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in shape.items()]
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
        "--local-ranks-filter=0", "-m", "rlf_bench.train_bench", "--only=rlf", "--json", "--threads=1",
        f"--model={model_dir}", f"--workdir={workdir / f'processes_{processes}'}", *flags,
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if '{"shape"' in line]  # the JSON report line
    if done.returncode != 0 or not lines:
        raise RuntimeError(
            f"the {processes}-process launch failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1][lines[-1].index('{"shape"') :])["rlf"]
    timed = result["step_s"][1:] if len(result["step_s"]) > 1 else result["step_s"]
    tokens = (
        result["tokens_per_step"][1:] if len(result["tokens_per_step"]) > 1 else result["tokens_per_step"]
    )
    result["tokens_per_s"] = sum(tokens) / sum(timed)
    result["mean_step_s"] = sum(timed) / len(timed)
    return result


def run_scale_bench(
    shape: dict[str, int],
    processes: int,
    model_dir: str | os.PathLike[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """1 process, then ``processes``; figures of both and the speed-up of the second."""
    root = Path(workdir or tempfile.mkdtemp(prefix="rlf-bench-scale-"))
    if model_dir is None:
        from rlf_trainer.data.models import build_tiny_qwen3

        model_dir = build_tiny_qwen3(root / "tiny-qwen3")
    report: dict[str, Any] = {"shape": dict(shape), "model": str(model_dir), "runs": {}}
    for count in sorted({1, processes}):
        report["runs"][str(count)] = run_launch(count, shape, model_dir, root)
    one, many = report["runs"]["1"], report["runs"][str(processes)]
    report["speedup_tokens_per_s"] = many["tokens_per_s"] / one["tokens_per_s"]
    report["speedup_step_time"] = one["mean_step_s"] / many["mean_step_s"]
    return report


def format_scale_report(report: dict[str, Any]) -> str:
    """A short human summary of :func:`run_scale_bench`."""
    s = report["shape"]
    lines = [
        f"scale bench: global batch {s['prompts']} prompts x {s['generations']} generations, "
        f"{s['max_new_tokens']} max new tokens, {s['steps']} steps (first untimed), model {report['model']}"
    ]
    for count, r in report["runs"].items():
        steps = ", ".join(f"{t:.2f}" for t in r["step_s"])
        lines.append(
            f"  {count} process{'es' if count != '1' else '  '}  {r['mean_step_s']:7.2f} s/step  "
            f"{r['samples_per_s']:7.2f} samples/s  {r['tokens_per_s']:8.1f} tokens/s   step times [{steps}] s"
        )
    lines.append(
        f"  speed-up: {report['speedup_step_time']:.2f}x step time, {report['speedup_tokens_per_s']:.2f}x tokens/s"
    )
    return "\n".join(lines)
