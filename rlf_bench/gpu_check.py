"""The GPU check: the figures we want from a lent GPU machine, in one run (``scripts/gpu_check.sh OUT``).

Parts, each timed and reported on its own (a part that fails records its error and the rest go on):

1. ``generate``: raw ``vllm.LLM.generate`` vs :class:`~rlf_trainer.policy.vllm.VLLMPolicy.generate`
   on the same prompts and sampling: tokens/s of both and the ratio (our wrapper's overhead).
2. ``grpo``: two GRPO steps of a random-init model with Qwen3-0.6B's layer shapes (28 layers,
   hidden 1024, 16 heads of 128, GQA 8) on ``RLF/Codebook-v0`` with the colocated vLLM engine
   (sleep/wake around training where supported, weight sync after each step): step times and
   ``sampler_kl`` (~0 after a sync means the engine got the trained weights).
3. ``rollout``: lockstep vs async rollout on ``RLF/DeepSearch-v0`` (every turn is a real BM25
   search, whatever a random model wrote): episodes/s of both and the ratio.
4. ``launch``: ``accelerate launch --num_processes 1 examples/train.py`` on tiny_test.yaml with this
   model, 2 steps: the launcher's start-up path (the one multi-GPU runs take) on the one device.
5. ``shared_prefix``: the update's forward and backward over one GRPO group, rows whole and with
   their prompt forwarded once (``shared_prefix``), in the run's precision: seconds of each and the
   log-prob gap (on a CPU sharing pays with a group a micro-batch; this says whether ``auto`` should
   share on a GPU).
6. peak GPU memory (``torch.cuda.max_memory_allocated`` and ``nvidia-smi``).

``--dry-run`` runs the same code path small: the tiny random Qwen3, few prompts and episodes, on
whatever vLLM is installed (the CPU build in ``.venv-vllm``); the test suite runs it so the script
cannot rot. The report is ``OUT/gpu_check.json``; the log is ``OUT/gpu_check.log`` (the shell script
tees it).

Example:
    bash scripts/gpu_check.sh /tmp/gpu_check              # on the GPU machine, <= 8 minutes
    python -m rlf_bench.gpu_check --dry-run --out /tmp/gc  # CPU, vLLM CPU build
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GPUCheckShape:
    """How big each part runs; :meth:`dry_run` is the CPU-sized version of the same code path."""

    hidden: int = 1024
    layers: int = 28
    heads: int = 16
    head_dim: int = 128
    generate_prompts: int = 256
    max_new_tokens: int = 256
    grpo_prompts: int = 8
    grpo_group: int = 8
    rollout_episodes: int = 256
    rollout_turns: int = 3
    dry: bool = False

    @classmethod
    def dry_run(cls) -> GPUCheckShape:
        return cls(hidden=64, layers=2, heads=4, head_dim=32, generate_prompts=8, max_new_tokens=16,
                   grpo_prompts=2, grpo_group=2, rollout_episodes=8, rollout_turns=2, dry=True)  # fmt: skip


def build_model(shape: GPUCheckShape, out: Path) -> Path:
    """The random-init Qwen3 of this shape (a tokenizer trained offline; a 1k vocabulary)."""
    from rlf_trainer.data.models import build_tiny_qwen3

    return build_tiny_qwen3(
        out, hidden=shape.hidden, layers=shape.layers, heads=shape.heads, head_dim=shape.head_dim
    )


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _policy(shape: GPUCheckShape, model: Path) -> Any:
    """VLLMPolicy where vLLM is installed, else HFPolicy on the GPU (or CPU): the report says which."""
    if vllm_available():
        from rlf_trainer.policy.vllm import VLLMPolicy

        return VLLMPolicy(model, **_vllm_kwargs(shape))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlf_trainer.policy.hf import HFPolicy

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    weights = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device)
    return HFPolicy(weights, AutoTokenizer.from_pretrained(model))


def _vllm_kwargs(shape: GPUCheckShape) -> dict[str, Any]:
    return {"gpu_memory_utilization": 0.3 if not shape.dry else 0.5, "max_model_len": 4096, "seed": 0}


def check_generate(shape: GPUCheckShape, model: Path) -> dict[str, Any]:
    """Raw vLLM vs VLLMPolicy: the same token prompts, the same sampling, tokens/s of both."""
    if not vllm_available():
        return {"skipped": "vllm is not installed on this machine"}
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    from rlf_trainer.policy.base import SamplingParams
    from rlf_trainer.policy.vllm import VLLMPolicy

    policy = VLLMPolicy(model, **_vllm_kwargs(shape))
    try:
        prompts = [[1 + (i * 7 + k) % 500 for k in range(64)] for i in range(shape.generate_prompts)]
        raw_params = [
            VLLMSamplingParams(
                max_tokens=shape.max_new_tokens,
                temperature=1.0,
                seed=i,
                ignore_eos=True,
                logprobs=0,
                detokenize=False,
            )  # fmt: skip
            for i in range(len(prompts))
        ]
        policy.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts[:2]], raw_params[:2], use_tqdm=False
        )
        t0 = time.perf_counter()
        raw = policy.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], raw_params, use_tqdm=False
        )
        raw_s = time.perf_counter() - t0
        raw_tokens = sum(len(o.outputs[0].token_ids) for o in raw)
        t0 = time.perf_counter()
        ours = policy.generate(prompts, SamplingParams(max_new_tokens=shape.max_new_tokens, seed=0))
        ours_s = time.perf_counter() - t0
        ours_tokens = sum(len(c.token_ids) for c in ours)
    finally:
        policy.close()
    raw_tps, ours_tps = raw_tokens / raw_s, ours_tokens / ours_s
    return {"raw_tokens_per_s": raw_tps, "policy_tokens_per_s": ours_tps, "policy_over_raw": ours_tps / raw_tps,
            "raw_tokens": raw_tokens, "policy_tokens": ours_tokens}  # fmt: skip


def check_grpo(shape: GPUCheckShape, model: Path, out: Path) -> dict[str, Any]:
    """Two GRPO steps on RLF/Codebook-v0 with the colocated vLLM engine (async rollout), else the HF backend."""
    from rlf_trainer.config import load_config
    from rlf_trainer.trainer import Trainer

    backend = ["policy.backend=vllm", "rollout.mode=async"] if vllm_available() else ["policy.backend=hf"]
    overrides = [
        f"model.path={model}", "model.prepare=null", "max_steps=2", *backend,
        f"rollout.prompts_per_step={shape.grpo_prompts}",
        f"algorithm.group_size={shape.grpo_group}", "rollout.max_turns=2", "rollout.max_new_tokens=64",
        f"policy.vllm.gpu_memory_utilization={_vllm_kwargs(shape)['gpu_memory_utilization']}",
        "policy.vllm.max_model_len=4096", "eval.every=0", "checkpoint.every=0", "checkpoint.save_final=false",
        "checkpoint.save_model=false", "checkpoint.resume=none", f"logging.dir={out}", "logging.run_name=gpu_check",
        "logging.progress_bar=false", "optim.lr=1e-5",
        "logging.report_to=[]",  # the GPU image may lack tensorboard; the report has the figures
    ]  # fmt: skip
    if not shape.dry:
        overrides.append("mixed_precision=bf16")
    config = Path(__file__).resolve().parents[1] / "examples" / "configs" / "smollm2_learn_cpu.yaml"
    trainer = Trainer(load_config(config, overrides))
    history = trainer.train()
    keys = ("step", "time/step", "time/generate", "time/train", "sampler_kl", "reward/mean", "samples/s")
    steps = [{k: r[k] for k in keys if k in r} for r in history.records]
    if not vllm_available():  # the HF policy samples with the trained module: there is nothing to compare
        return {"backend": backend, "steps": steps, "sampler_kl": "not measured: the HF backend samples with the trained module"}  # fmt: skip
    unmeasured = [step["step"] for step in steps if "sampler_kl" not in step]
    if unmeasured:  # the figure this part exists for: a missing one is a failure, not a blank
        raise RuntimeError(f"the vLLM run logged no sampler_kl at steps {unmeasured}")
    return {"backend": backend, "steps": steps}


def check_launch(shape: GPUCheckShape, model: Path, out: Path) -> dict[str, Any]:
    """``accelerate launch --num_processes 1 examples/train.py`` (tiny_test.yaml, 2 steps): the launcher's path.

    The same start-up as a multi-GPU launch (launcher environment, :func:`rlf_trainer.run.distributed.make_accelerator`,
    the trainer's device placement) on the one device there is, as users start it.
    """
    repo = Path(__file__).resolve().parents[1]
    args = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", str(repo / "examples" / "train.py"),
        "--config", str(repo / "examples" / "configs" / "tiny_test.yaml"), f"model.path={model}",
        "model.prepare=null", f"logging.dir={out}", "logging.run_name=launch", "logging.progress_bar=false",
        f"env.kwargs.mcp_servers.mcpServers.latency.command={sys.executable}", "rollout.max_new_tokens=16",
        "eval.every=0", "checkpoint.every=0", "checkpoint.resume=none", "logging.report_to=[]",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    metrics = out / "launch" / "metrics.jsonl"
    steps = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    report: dict[str, Any] = {
        "returncode": done.returncode,
        "wall_s": time.perf_counter() - started,
        "steps": [{k: r.get(k) for k in ("step", "time/step", "reward/mean")} for r in steps],
        "exported_model": (out / "launch" / "model" / "config.json").is_file(),
    }
    if done.returncode != 0 or len(steps) != 2:
        raise RuntimeError(f"accelerate launch failed ({done.returncode}): {done.stderr[-3000:]}")
    return report


class AlwaysSearchParser:
    """Every turn searches: the model's text (its first 64 characters) is the query."""

    def parse(self, text: str) -> Any:
        from rlf_envs.tools.parsers import ParsedTurn
        from rlf_envs.types import ToolCall

        return ParsedTurn(calls=[ToolCall("search", {"query": text[:64] or "river"})], content=text)


def check_rollout(shape: GPUCheckShape, model: Path) -> dict[str, Any]:
    """Lockstep vs async on RLF/DeepSearch-v0, the same prompts and seed."""
    import gymnasium as gym

    import rlf_envs  # noqa: F401
    from rlf_trainer.policy.base import SamplingParams
    from rlf_trainer.rollout.async_rollout import run_async_rollout
    from rlf_trainer.rollout.lockstep import run_rollout

    policy = _policy(shape, model)
    envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=shape.rollout_episodes, parser=AlwaysSearchParser(),
                        max_turns=shape.rollout_turns, autoreset_mode="Disabled")  # fmt: skip
    rows: dict[str, Any] = {"policy": type(policy).__name__}
    try:
        prompts = list(range(shape.rollout_episodes))
        sampling = SamplingParams(max_new_tokens=shape.max_new_tokens, seed=0)
        for mode, rollout in (
            ("warmup", run_async_rollout),
            ("lockstep", run_rollout),
            ("async", run_async_rollout),
        ):
            t0 = time.perf_counter()
            batch = rollout(envs, policy, prompts, group_size=1, sampling=sampling, max_total_tokens=8192)
            wall = time.perf_counter() - t0
            rows[mode] = {"episodes": len(batch), "wall_s": wall, "episodes_per_s": len(batch) / wall,
                          "tokens_per_s": int(batch.loss_mask.sum()) / wall}  # fmt: skip
    finally:
        envs.close()
        policy.close()
    rows.pop("warmup")
    rows["async_speedup"] = rows["lockstep"]["wall_s"] / rows["async"]["wall_s"]
    return rows


def check_shared_prefix(shape: GPUCheckShape, model: Path) -> dict[str, Any]:
    """One group's update forward + backward, whole rows vs the prompt shared; best of 2 each."""
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from rlf_trainer.algorithms.optimize import token_logprobs
    from rlf_trainer.run.precision import resolve_mixed_precision

    # the precision check_grpo's trainer set up (Accelerate keeps one per process)
    accelerator = Accelerator(mixed_precision=resolve_mixed_precision("auto") if shape.dry else "bf16")
    net = accelerator.prepare(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32))
    rows, prompt, own = (2, 24, 8) if shape.dry else (8, 1024, 512)
    generator = torch.Generator().manual_seed(0)
    vocab = net.config.vocab_size
    head, tails = torch.randint(3, vocab, (prompt,), generator=generator), torch.randint(3, vocab, (rows, own), generator=generator)  # fmt: skip
    ids = torch.cat([head.expand(rows, -1), tails], dim=1).to(accelerator.device)
    mask, trained = torch.ones_like(ids), torch.zeros_like(ids[:, 1:])
    trained[:, prompt - 1 :] = 1
    seconds: dict[bool, list[float]] = {False: [], True: []}
    logp: dict[bool, Any] = {}
    for share in (False, True, False, True):
        net.zero_grad(set_to_none=True)
        _sync()
        started = time.perf_counter()
        result = token_logprobs(accelerator, net, ids, mask, trained, share_prefix=share)
        result.logp.sum().backward()
        _sync()
        seconds[share].append(time.perf_counter() - started)
        logp[share] = result.logp.detach()
    whole, shared = min(seconds[False]), min(seconds[True])
    return {"precision": accelerator.mixed_precision, "rows": rows, "prompt_tokens": prompt, "own_tokens": own,
            "whole_s": whole, "shared_s": shared, "whole_over_shared": whole / shared,
            "max_logp_gap": float((logp[True] - logp[False]).abs().max())}  # fmt: skip


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def gpu_memory() -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        out["torch_max_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        out["device"] = torch.cuda.get_device_name(0)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)  # fmt: skip
        out["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        out["nvidia_smi"] = f"unavailable: {exc}"
    return out


def run_gpu_check(shape: GPUCheckShape, out: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every part in turn; a failing part records its traceback and the others still run."""
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "shape": asdict(shape),
        "python": sys.version.split()[0],
        "machine": platform.node(),
    }
    started = time.perf_counter()
    model = build_model(shape, out / "model")
    report["model_build_s"] = time.perf_counter() - started
    parts: dict[str, Callable[[], dict[str, Any]]] = {
        "generate": lambda: check_generate(shape, model),
        "grpo": lambda: check_grpo(shape, model, out / "runs"),
        "rollout": lambda: check_rollout(shape, model),
        "launch": lambda: check_launch(shape, model, out / "runs"),
        "shared_prefix": lambda: check_shared_prefix(shape, model),
    }
    for name, part in parts.items():
        t0 = time.perf_counter()
        log(f"== {name}")
        try:
            report[name] = part()
        except Exception:  # the other parts still run; the report says what broke
            report[name] = {"error": traceback.format_exc(limit=8)}
        report[name]["part_s"] = time.perf_counter() - t0
        log(json.dumps({name: report[name]}, default=str))
    report["memory"] = gpu_memory()
    report["total_s"] = time.perf_counter() - started
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlf_bench.gpu_check", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", required=True, help="folder for gpu_check.json and the run files")
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny shapes on whatever vLLM is installed (CPU)"
    )
    args = parser.parse_args(argv)
    shape = GPUCheckShape.dry_run() if args.dry_run else GPUCheckShape()
    report = run_gpu_check(shape, Path(args.out), log=lambda m: print(m, flush=True))
    failed = [name for name in ("generate", "grpo", "rollout", "launch") if "error" in report[name]]
    print(f"gpu check: {Path(args.out) / 'gpu_check.json'}; failed parts: {failed or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
