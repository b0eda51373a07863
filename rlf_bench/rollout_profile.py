"""``rlf-bench profile --config X.yaml``: where a rollout's generation time goes, by kind of work.

Runs trainer steps of the config (the first a warm-up, not profiled), profiling each call of the
policy's ``generate`` on its own (``torch.profiler``; with ``--update`` each GRPO update too), then
splits the generation's (and the update's) wall time:

- **body matmuls**: ``mm`` / ``addmm`` / ``bmm`` / ``linear`` of the transformer layers;
- **vocabulary projection**: the same ops where a shape has the vocabulary's size (the LM head);
- **attention**: scaled-dot-product attention kernels;
- **logits and sampling**: other ops on vocabulary-sized tensors (softmax, warpers, the sampler; in
  the update the log-softmax of the picked tokens);
- **other torch ops**: norms, activations, rotary embeddings, copies, KV-cache updates;
- **outside torch ops**: the rest of the wall time, i.e. Python in ``generate`` and the model's
  modules, the policy's batching and prefix cache, and the profiler's own cost per op.

It also counts the model's forward calls during generation (one ``embedding`` each), so the wall
time per forward and the tokens per forward show whether decoding is bound by compute or by the
fixed cost of a step. Figures are the profiler's CPU times on this machine, now; the profiler adds
a few microseconds per op, which lands in "outside torch ops".

Example:
    rlf-bench profile --config examples/configs/smollm2_learn_cpu.yaml --steps 2
    rlf-bench profile --config examples/configs/smollm2_learn_cpu.yaml --precision no --json
    rlf-bench profile --config examples/configs/smollm2_learn_cpu.yaml --update --precision bf16

The profiler lengthens what it records, small ops most, and the ops' own times with them: one
``generate`` of 16 x 400 prompt tokens and 48 sampled ones (SmolLM2-135M, fp32, 2 threads) took 13.4 s
unprofiled, 25.0 s profiled without shapes and 33.8 s with them (as here), its matmuls' self time
alone 12.6 s. Read the split as where the time goes, not as what each kind would cost on its own,
and time phases with ``rlf-bench train``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Iterable
from typing import Any

CATEGORIES = (
    "body matmuls",
    "vocabulary projection",
    "attention",
    "logits and sampling",
    "other torch ops",
    "outside torch ops",
)
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"})
RANGE = "rlf/generate"
UPDATE_RANGE = "rlf/update"


def categorise(name: str, shapes: Iterable[Iterable[int]], vocab_size: int) -> str:
    """The category of one torch op from its name and input shapes (see the module doc).

    Example:
        >>> categorise("aten::addmm", [[1536], [8, 576], [576, 1536]], vocab_size=49152)
        'body matmuls'
        >>> categorise("aten::mm", [[8, 576], [576, 49152]], vocab_size=49152)
        'vocabulary projection'
        >>> categorise("aten::softmax", [[8, 49152]], vocab_size=49152), categorise("aten::mul", [[8, 576]], 49152)
        ('logits and sampling', 'other torch ops')
    """
    vocab_sized = any(vocab_size in shape for shape in shapes if shape)
    if name in MATMUL_OPS:
        return "vocabulary projection" if vocab_sized else "body matmuls"
    if "scaled_dot_product" in name or "attention" in name:
        return "attention"
    return "logits and sampling" if vocab_sized else "other torch ops"


def split_range_time(events: list[Any], vocab_size: int, range_name: str = RANGE) -> dict[str, Any]:
    """Seconds per category inside the ``range_name`` ranges of a profile's events, and forwards.

    Ops count by their self time (children apart), on the thread of the range they started in (on a
    CPU the backward runs on the thread that calls it).
    """
    windows = [(e.thread, e.time_range.start, e.time_range.end) for e in events if e.name == range_name]
    wall_us = sum(end - start for _, start, end in windows)
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    forwards = 0
    for event in events:
        if "::" not in event.name or not any(
            t == event.thread and start <= event.time_range.start < end for t, start, end in windows
        ):
            continue
        category = categorise(event.name, event.input_shapes or [], vocab_size)
        seconds[category] += event.self_cpu_time_total / 1e6
        forwards += event.name == "aten::embedding"
    seconds["outside torch ops"] = max(0.0, wall_us / 1e6 - sum(seconds.values()))
    return {"wall_s": wall_us / 1e6, "seconds": seconds, "forwards": forwards}


def profile_config(
    config: str, precision: str, steps: int, overrides: list[str], *, update: bool = False
) -> dict[str, Any]:
    """``steps`` trainer steps of ``config`` (the first unprofiled); the generation's split per step,
    and with ``update`` the GRPO update's (``update_s_per_step``, ``update_seconds_per_step``)."""
    import torch

    from rlf_bench.speed_bench import bench_overrides
    from rlf_trainer.algorithms import grpo
    from rlf_trainer.config import load_config
    from rlf_trainer.trainer import Trainer

    workdir = tempfile.mkdtemp(prefix="rlf-profile-")
    fixed = bench_overrides(precision, steps, workdir)
    trainer = Trainer(load_config(config, [*overrides, *fixed]))
    policy, grpo_update = trainer.policy, grpo.update
    generate = policy.generate
    vocab = trainer.accelerator.unwrap_model(trainer.model).config.vocab_size
    splits: dict[str, list[dict[str, Any]]] = {RANGE: [], UPDATE_RANGE: []}
    overhead = [0.0]
    profiling = False

    def profiled(call: Any, range_name: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if not profiling:
                return call(*args, **kwargs)
            # one profile per call: recording a whole step (its backward included) takes gigabytes
            activities = [torch.profiler.ProfilerActivity.CPU]
            started = time.perf_counter()
            with (
                torch.profiler.profile(activities=activities, record_shapes=True) as prof,
                torch.profiler.record_function(range_name),
            ):
                out = call(*args, **kwargs)
            split = split_range_time(list(prof.events()), vocab, range_name)
            splits[range_name].append(split)
            # the profiler's start, stop and event walk are no part of the step's own time
            overhead[0] += time.perf_counter() - started - split["wall_s"]
            return out

        return run

    policy.generate = profiled(generate, RANGE)  # type: ignore[method-assign]
    if update:  # grpo.train_step looks the name up at each call
        grpo.update = profiled(grpo_update, UPDATE_RANGE)  # type: ignore[assignment]
    records = []
    try:
        trainer.train_step()  # warm-up: kernels chosen, caches filled
        profiling = True
        for _ in range(max(1, steps - 1)):
            records.append(trainer.train_step())
    finally:
        policy.generate = generate  # type: ignore[method-assign]
        grpo.update = grpo_update  # type: ignore[assignment]
        trainer.close()
    precision_used = trainer.config.mixed_precision
    return _report(config, precision_used, records, splits, overhead[0], update=update)


def _report(
    config: str,
    precision: str,
    records: list[dict[str, float]],
    splits: dict[str, list[dict[str, Any]]],
    profiler_s: float,
    *,
    update: bool,
) -> dict[str, Any]:
    """Per-step figures of the profiled steps' metrics and splits; ``profiler_s`` (the profiler's
    own start, stop and event walk) is left out of the step time."""
    import torch

    profiled_steps = len(records)
    generation, updates = _sum_splits(splits[RANGE]), _sum_splits(splits[UPDATE_RANGE])
    generated = sum(r.get("rollout/generated_tokens", 0.0) for r in records)
    report = {
        "config": config,
        "precision": precision,
        "threads": torch.get_num_threads(),
        "profiled_steps": profiled_steps,
        "generation_s_per_step": generation["wall_s"] / profiled_steps,
        "tools_s_per_step": sum(r.get("time/tools", 0.0) for r in records) / profiled_steps,
        "step_s": (sum(r["time/step"] for r in records) - profiler_s) / profiled_steps,
        "profiler_s_per_step": profiler_s / profiled_steps,
        "seconds_per_step": {k: v / profiled_steps for k, v in generation["seconds"].items()},
        "forwards_per_step": generation["forwards"] / profiled_steps,
        "ms_per_forward": 1e3 * generation["wall_s"] / max(1, generation["forwards"]),
        "generated_tokens_per_forward": generated / max(1, generation["forwards"]),
        "generated_tokens_per_step": generated / profiled_steps,
    }
    if update:
        report["update_s_per_step"] = updates["wall_s"] / profiled_steps
        report["update_seconds_per_step"] = {k: v / profiled_steps for k, v in updates["seconds"].items()}
        report["update_tokens_per_step"] = sum(r.get("update/tokens", 0.0) for r in records) / profiled_steps
    return report


def _sum_splits(splits: list[dict[str, Any]]) -> dict[str, Any]:
    """The calls' splits added up."""
    return {
        "wall_s": sum(s["wall_s"] for s in splits),
        "seconds": {c: sum(s["seconds"][c] for s in splits) for c in CATEGORIES},
        "forwards": sum(s["forwards"] for s in splits),
    }


def format_profile(report: dict[str, Any]) -> str:
    """A table of the generation's time per category, per step, and its share (and the update's)."""
    lines = [
        f"rlf-bench profile --config {report['config']}: precision {report['precision']}, "
        f"{report['threads']} threads, {report['profiled_steps']} profiled steps",
        f"step {report['step_s']:.1f} s, of which generation {report['generation_s_per_step']:.1f} s "
        f"(tool calls {report['tools_s_per_step']:.2f} s, outside generate); the profiler's own "
        f"{report['profiler_s_per_step']:.1f} s a step left out",
    ]
    phases = [("generation", report["generation_s_per_step"], report["seconds_per_step"])]
    if "update_s_per_step" in report:
        phases.append(("update", report["update_s_per_step"], report["update_seconds_per_step"]))
    for phase, wall, seconds_per_step in phases:
        lines.append(f"{phase + ' time':<26}{'s/step':>8}{'share':>8}")
        for category, seconds in seconds_per_step.items():
            lines.append(f"{category:<26}{seconds:>8.2f}{seconds / (wall or 1.0):>8.0%}")
    lines.append(
        f"{report['forwards_per_step']:.0f} forwards a step, {report['ms_per_forward']:.1f} ms each, "
        f"{report['generated_tokens_per_forward']:.1f} generated tokens per forward"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from rlf_bench.speed_bench import config_bench_args

    steps_help = "trainer steps, the first not profiled"
    update_help = "profile each GRPO update as well"
    args = config_bench_args(
        "rlf-bench profile", __doc__, argv, precision="auto", steps=2, steps_help=steps_help,
        flags={"--update": update_help},
    )  # fmt: skip
    report = profile_config(args.config, args.precision, args.steps, args.overrides, update=args.update)
    print(format_profile(report) + (f"\n{json.dumps(report)}" if args.json else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
