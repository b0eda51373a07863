"""Evaluate a model on a config's env test split, exactly as the trainer's eval runs, into a JSON file.

    python -m rlf_trainer.evaluate_cli --config examples/configs/deepsearch_smollm2_sft_cpu.yaml \\
        --out runs/deepsearch/seed0/base_eval.json [dotted.key=value ...]

The model is the config's ``model.path`` (or ``model.prepare``). Only what playing needs is built
(model, tokenizer, policy, envs): no optimizer, no LR schedule, no run folder, nothing trained.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, help="JSON file for the eval metrics")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, as for rlf-train")
    args = parser.parse_args(argv)

    from accelerate.utils import set_seed

    from rlf_trainer import build
    from rlf_trainer.config import load_config
    from rlf_trainer.observe.evaluation import evaluate
    from rlf_trainer.rollout.collect import RolloutState, episodes_per_process
    from rlf_trainer.run.distributed import make_accelerator, stop_rank_watch
    from rlf_trainer.run.precision import resolve_mixed_precision

    config = load_config(args.config, args.overrides)
    config.mixed_precision = resolve_mixed_precision(config.mixed_precision)
    accelerator = make_accelerator(config.distributed.timeout_s, mixed_precision=config.mixed_precision)
    set_seed(config.seed)
    model_path = build.prepared_model_path(config, accelerator)
    tokenizer = build.load_tokenizer(config, model_path)
    model = build.load_model(config, model_path).to(accelerator.device)
    local_episodes = episodes_per_process(config, accelerator.num_processes)
    envs = build.make_envs(config, local_episodes)
    policy = None
    try:
        policy = build.make_policy(config, accelerator, model, tokenizer, model_path)
        metrics = evaluate(RolloutState(config, accelerator, policy, envs), step=0)
    finally:
        if policy is not None:
            policy.close()
        stop_rank_watch(accelerator)
        envs.close()
    if accelerator.is_main_process:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(metrics, indent=1, sort_keys=True))
        print(json.dumps({k: round(v, 4) for k, v in metrics.items() if k.endswith(("accuracy", "reward"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
