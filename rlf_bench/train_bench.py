"""``rlf-bench train``: our GRPO trainer and TRL's ``GRPOTrainer``, same model, data and batch shape.

Both train the same model (default: the tiny random Qwen3, built offline in seconds) on the same
env, ``RLF/ToolUse-v0`` with an ``add`` python tool and exact-match reward, with the same batch:
``prompts`` x ``generations`` samples a step, ``max_new_tokens`` generated tokens at most, beta 0,
one optimizer step per generation batch, CPU. Ours drives the vector env with its HF policy; TRL
generates with its own loop and reaches the env through the env half's TRL adapter,
:mod:`rlf_envs.integrations.trl_environment` (its ``environment_factory``: tool calls and reward run in
our env), as any TRL user would. The first step of each is a warm-up
and is not timed (unless only one step runs). Samples/s = samples of the timed steps / their time.

Example:
    rlf-bench train                           # 2 prompts x 4 generations, 32 tokens, 3 steps
    rlf-bench train --prompts 4 --generations 8 --max-new-tokens 64 --steps 4 --json
    rlf-bench train --num-processes 2         # ours on 1 vs 2 processes (rlf_bench.scale_bench)
    rlf-bench train --config X.yaml           # ours on a config, fp32 vs bf16 per phase (rlf_bench.speed_bench)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TASKS = [
    {"id": f"add{i}", "question": f"What is {i} + {i + 3}? Use the add tool.", "answer": str(2 * i + 3)}
    for i in range(16)
]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term
        b: the second term
    """
    return a + b


@dataclass(frozen=True)
class TrainBenchShape:
    """What both trainers run: the batch shape and the length limits."""

    prompts: int = 2
    generations: int = 4
    max_new_tokens: int = 32
    steps: int = 3
    max_turns: int = 2
    seed: int = 0

    @property
    def samples_per_step(self) -> int:
        return self.prompts * self.generations


def _env_kwargs(shape: TrainBenchShape) -> dict[str, Any]:
    return {"tasks": TASKS, "reward": "exact_match", "max_turns": shape.max_turns}


def _throughput(wall_s: list[float], cpu_s: list[float], samples_per_step: int) -> dict[str, Any]:
    """Samples/s over the timed steps (all but the first, when there are several).

    ``samples_per_cpu_s`` divides by the process's CPU time instead of the wall clock: on a shared
    machine it moves far less with other people's load than the wall clock does.
    """
    first = 1 if len(wall_s) > 1 else 0
    return {
        "samples_per_s": samples_per_step * (len(wall_s) - first) / sum(wall_s[first:]),
        "samples_per_cpu_s": samples_per_step * (len(cpu_s) - first) / sum(cpu_s[first:]),
        "step_s": wall_s,
        "step_cpu_s": cpu_s,
        "timed_steps": len(wall_s) - first,
    }


class StepClock:
    """Wall and process-CPU time of each step: ``begin()`` / ``end()`` around it."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._started = (0.0, 0.0)

    def begin(self) -> None:
        self._started = (time.perf_counter(), time.process_time())

    def end(self) -> None:
        self.wall.append(time.perf_counter() - self._started[0])
        self.cpu.append(time.process_time() - self._started[1])


def run_rlf(model_dir: str | os.PathLike[str], shape: TrainBenchShape, workdir: Path) -> dict[str, Any]:
    """Our :class:`~rlf_trainer.trainer.Trainer` for ``shape.steps`` steps; its step times and samples/s."""
    from rlf_trainer.config import from_dict
    from rlf_trainer.trainer import Trainer

    config = from_dict(
        {
            "model": {"path": str(model_dir)},
            "env": {
                "id": "RLF/ToolUse-v0",
                "kwargs": {"tasks": TASKS, "reward": "exact_match"},
                "import_kwargs": {"python_tools": ["rlf_bench.train_bench:add"]},
                "num_train_tasks": len(TASKS),
            },
            "rollout": {
                "prompts_per_step": shape.prompts,
                "max_turns": shape.max_turns,
                "max_new_tokens": shape.max_new_tokens,
                "max_total_tokens": 4096,
                "temperature": 1.0,
            },
            "algorithm": {"loss": "grpo", "group_size": shape.generations, "beta": 0.0},
            "optim": {"lr": 1e-5},
            "policy": {"backend": "hf"},
            "checkpoint": {"every": 0, "save_final": False, "resume": "none"},
            "logging": {
                "dir": str(workdir),
                "run_name": "rlf",
                "report_to": [],
                "samples_jsonl": False,
                "progress_bar": False,
            },
            "seed": shape.seed,
            "max_steps": shape.steps,
        }
    ).validate()
    trainer = Trainer(config)
    clock = StepClock()
    metrics: list[dict[str, float]] = []
    try:
        # train_step, not train(): the same work per step without checkpoints, evals and curves
        for _ in range(shape.steps):
            clock.begin()
            metrics.append(trainer.train_step())
            clock.end()
    finally:
        trainer.close()
    phases = {key: [m[f"time/{key}"] for m in metrics] for key in ("generate", "tools", "tokenize", "train")}
    return {
        **_throughput(clock.wall, clock.cpu, shape.samples_per_step),
        "reward_mean": [m["reward/mean"] for m in metrics],
        "tokens_per_step": [m["response_length"] * shape.samples_per_step for m in metrics],
        "phase_s": phases,
    }


def run_trl(model_dir: str | os.PathLike[str], shape: TrainBenchShape, workdir: Path) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on the same env, model and batch; its step times and samples/s."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import trl
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from rlf_envs.integrations.trl_environment import (
        cpu_grpo_config,
        env_dataset,
        make_trl_environment,
        prepare_tokenizer,
        rlf_env_reward,
    )

    clock = StepClock()

    class Timing(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.end()

    env_kwargs = {**_env_kwargs(shape), "python_tools": [add]}
    Env = make_trl_environment("RLF/ToolUse-v0", capacity=shape.samples_per_step, **env_kwargs)
    try:
        config = cpu_grpo_config(
            workdir / "trl",
            prompts=shape.prompts,
            generations=shape.generations,
            max_turns=shape.max_turns,
            max_completion_length=shape.max_new_tokens,
            max_steps=shape.steps,
            seed=shape.seed,
            loss_type="grpo",
            temperature=1.0,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=str(model_dir),
            reward_funcs=[rlf_env_reward],
            args=config,
            train_dataset=env_dataset("RLF/ToolUse-v0", shape.prompts * shape.steps, **env_kwargs),
            processing_class=prepare_tokenizer(model_dir),
            environment_factory=Env,
            callbacks=[Timing()],
        )
        trainer.train()
    finally:
        Env.close()
    logs = [r for r in trainer.state.log_history if "rewards/rlf_env_reward/mean" in r]
    return {
        **_throughput(clock.wall, clock.cpu, shape.samples_per_step),
        "reward_mean": [float(r["rewards/rlf_env_reward/mean"]) for r in logs],
        "trl_version": trl.__version__,
    }


def run_train_bench(
    shape: TrainBenchShape,
    model_dir: str | os.PathLike[str] | None = None,
    frameworks: tuple[str, ...] = ("rlf", "trl"),
    workdir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Both trainers (or those in ``frameworks``) on ``shape``; figures and ``rlf_over_trl``.

    Example:
        >>> report = run_train_bench(TrainBenchShape(steps=2))      # doctest: +SKIP
        >>> report["rlf"]["samples_per_s"], report["rlf_over_trl"]  # doctest: +SKIP
    """
    root = Path(workdir or tempfile.mkdtemp(prefix="rlf-bench-train-"))
    if model_dir is None:
        from rlf_trainer.data.models import build_tiny_qwen3

        model_dir = build_tiny_qwen3(root / "tiny-qwen3")
    import torch

    report: dict[str, Any] = {
        "shape": asdict(shape),
        "model": str(model_dir),
        "torch_threads": torch.get_num_threads(),
    }
    runners = {"rlf": run_rlf, "trl": run_trl}
    for name in frameworks:
        started = time.perf_counter()
        report[name] = runners[name](model_dir, shape, root)
        report[name]["run_s"] = time.perf_counter() - started
    if "rlf" in report and "trl" in report:
        report["rlf_over_trl"] = report["rlf"]["samples_per_s"] / report["trl"]["samples_per_s"]
        report["rlf_over_trl_cpu"] = report["rlf"]["samples_per_cpu_s"] / report["trl"]["samples_per_cpu_s"]
    return report


def format_train_report(report: dict[str, Any]) -> str:
    """A short human summary of :func:`run_train_bench`."""
    s = report["shape"]
    lines = [
        f"train bench: {s['prompts']} prompts x {s['generations']} generations, "
        f"{s['max_new_tokens']} max new tokens, {s['steps']} steps (first untimed), model {report['model']}",
    ]
    for name, label in (("rlf", "rlf Trainer"), ("trl", "TRL GRPOTrainer")):
        if name in report:
            r = report[name]
            steps = ", ".join(f"{t:.2f}" for t in r["step_s"])
            lines.append(
                f"  {label:<16} {r['samples_per_s']:8.2f} samples/s  {r['samples_per_cpu_s']:8.2f} samples/cpu-s"
                f"   step times [{steps}] s"
            )
    if "rlf_over_trl" in report:
        lines.append(
            f"  rlf / TRL        {report['rlf_over_trl']:8.2f}x (wall)  {report['rlf_over_trl_cpu']:6.2f}x (cpu)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--config" or a.startswith("--config=") for a in argv):  # our trainer per precision
        from rlf_bench.speed_bench import main as speed_main

        return speed_main(argv)
    parser = argparse.ArgumentParser(prog="rlf-bench train", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="HF model folder (default: the tiny random Qwen3)")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--max-turns", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=["rlf", "trl"], default=None, help="run one trainer only")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads for both (1: steadiest on a shared box)"
    )
    parser.add_argument(
        "--workdir", default=None, help="where runs and the tiny model go (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    parser.add_argument(
        "--num-processes", type=int, default=1, help="N > 1: ours on 1 and on N processes, same global batch"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.max_turns < 1:
        parser.error("--steps and --max-turns must be >= 1")
    shape = TrainBenchShape(
        prompts=args.prompts,
        generations=args.generations,
        max_new_tokens=args.max_new_tokens,
        steps=args.steps,
        max_turns=args.max_turns,
        seed=args.seed,
    )
    if args.num_processes > 1:
        from rlf_bench.scale_bench import format_scale_report, run_scale_bench

        scale = run_scale_bench(asdict(shape), args.num_processes, args.model, args.workdir)
        print(format_scale_report(scale) + (f"\n{json.dumps(scale)}" if args.json else ""), flush=True)
        return 0
    frameworks = (args.only,) if args.only else ("rlf", "trl")
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    if "trl" in frameworks and importlib.util.find_spec("trl") is None:
        print(
            "rlf-bench train needs TRL for the comparison: pip install trl (or pass --only rlf)",
            file=sys.stderr,
        )
        return 2
    # the trainers' own progress output would bury the summary
    noise = io.StringIO()
    with contextlib.redirect_stdout(noise):
        report = run_train_bench(shape, args.model, frameworks, args.workdir)
    print(format_train_report(report), flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
