"""How much of an update's forward + backward ``torch.compile`` recovers on this CPU: SmolLM2-135M,
one batch of fixed shape, eager and compiled, fp32 and bf16 autocast (docs/benchmarks.md).

The bound in docs/benchmarks.md says bf16 alone cannot make the update more than ~1.8x faster: about
half of its time is not matmuls (norms, rotary embeddings, SiLU, softmax, casts). Fusing that work
is what compilation offers; this measures it before the trainer depends on it.

    python scripts/bench_compile_probe.py [MODEL_DIR] [--batch 2] [--tokens 768] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def loss_of(model: torch.nn.Module, ids: torch.Tensor, autocast: bool) -> torch.Tensor:
    """A stand-in for the policy loss: the body under autocast, the log-softmax of the picked tokens
    in fp32 (as the trainer computes it)."""
    context = torch.autocast("cpu", torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        hidden = model.model(input_ids=ids).last_hidden_state
    logits = torch.nn.functional.linear(hidden[:, :-1].float(), model.lm_head.weight)
    return -logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).mean()


def time_step(step, ids: torch.Tensor, repeats: int) -> tuple[float, float]:
    """(first call's seconds, the median of ``repeats`` more) of forward + backward."""
    started = time.perf_counter()
    step(ids).backward()
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step(ids).backward()
        times.append(time.perf_counter() - started)
    return first, sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_model = Path(os.environ.get("RLF_CACHE_DIR", Path.home() / ".cache/rlf")) / "models/smollm2-135m"
    parser.add_argument("model", nargs="?", default=str(default_model))
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.config.use_cache = False
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.tokens))
    tokens = args.batch * args.tokens
    print(f"SmolLM2-135M, {args.batch} x {args.tokens} tokens, {torch.get_num_threads()} threads")
    print(f"{'variant':<22} {'first call s':>12} {'s/step':>8} {'tokens/s':>9} {'vs eager fp32':>14}")
    base = None
    for name, autocast, compiled in (
        ("eager fp32", False, False),
        ("eager bf16 autocast", True, False),
        ("compiled fp32", False, True),
        ("compiled bf16 autocast", True, True),
    ):
        torch._dynamo.reset()

        def step(batch: torch.Tensor, autocast: bool = autocast) -> torch.Tensor:
            return loss_of(model, batch, autocast)

        first, seconds = time_step(torch.compile(step) if compiled else step, ids, args.repeats)
        model.zero_grad(set_to_none=True)
        base = base or seconds
        print(f"{name:<22} {first:>12.1f} {seconds:>8.2f} {tokens / seconds:>9.1f} {base / seconds:>13.2f}x")


if __name__ == "__main__":
    main()
