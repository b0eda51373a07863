"""Evaluate a model on a config's env test split, exactly as the trainer's eval runs, into a JSON file.

    python -m rlf_trainer.evaluate_cli --config examples/configs/deepsearch_smollm2_sft_cpu.yaml \\
        --out runs/deepsearch/seed0/base_eval.json [dotted.key=value ...]

The model is the config's ``model.path`` (or ``model.prepare``); nothing is trained or saved.
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

    from rlf_trainer.config import load_config
    from rlf_trainer.trainer import GRPOTrainer

    # an eval trains nothing: the stage (and its data) does not matter
    overrides = [
        *args.overrides,
        "algorithm.name=grpo",
        "checkpoint.resume=none",
        "logging.tensorboard=false",
    ]
    trainer = GRPOTrainer(load_config(args.config, overrides))
    try:
        metrics = trainer.evaluate()
    finally:
        trainer.close()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(metrics, indent=1, sort_keys=True))
    print(json.dumps({k: round(v, 4) for k, v in metrics.items() if k.endswith(("accuracy", "reward"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
