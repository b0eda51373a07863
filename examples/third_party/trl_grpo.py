"""Train with TRL's ``GRPOTrainer`` on an RLF env: TRL generates, our env runs the tools and scores.

The adapter (an ``environment_factory`` class built from any env id, the env reward as a TRL reward
function, the prompt dataset) is :mod:`rlf_envs.integrations.trl_environment`, installed with the
package; this script wires it into ``GRPOTrainer`` (docs/third_party_trainers.md).

Run (CPU, tiny random Qwen3 built offline, a few seconds a step)::

    python examples/third_party/trl_grpo.py --steps 2
    python examples/third_party/trl_grpo.py --model ~/.cache/rlf/models/smollm2-135m --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from rlf_envs.integrations.trl_environment import (
    cpu_grpo_config,
    env_dataset,
    make_trl_environment,
    prepare_tokenizer,
    rlf_env_reward,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="RLF/DeepSearch-v0")
    parser.add_argument("--model", default=None, help="HF model folder (default: a tiny random Qwen3)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument("--generations", type=int, default=4, help="GRPO group size")
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args(argv)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOTrainer

    workdir = Path(args.output_dir or tempfile.mkdtemp(prefix="rlf-trl-"))
    model_path = args.model
    if model_path is None:
        from rlf_trainer.data.models import build_tiny_qwen3

        model_path = build_tiny_qwen3(workdir / "tiny-qwen3")
    batch = args.prompts * args.generations
    env_kwargs = {"max_turns": args.max_turns}
    Env = make_trl_environment(args.env, capacity=batch, **env_kwargs)
    try:
        config = cpu_grpo_config(
            workdir / "trl",
            prompts=args.prompts,
            generations=args.generations,
            max_turns=args.max_turns,
            max_completion_length=args.max_completion_length,
            max_steps=args.steps,
        )
        trainer = GRPOTrainer(
            model=str(model_path),
            reward_funcs=[rlf_env_reward],
            args=config,
            train_dataset=env_dataset(args.env, args.prompts * args.steps, **env_kwargs),
            processing_class=prepare_tokenizer(model_path),
            environment_factory=Env,
        )
        trainer.train()
    finally:
        Env.close()
    for record in trainer.state.log_history:
        print(json.dumps({k: v for k, v in record.items() if "reward" in k or k in ("step", "loss")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
