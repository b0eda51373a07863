"""Train a tool-using policy with GRPO on an RLF env.

Usage:
    python examples/train.py --config examples/configs/smollm2_cpu.yaml [dotted.key=value ...]
    accelerate launch --config_file examples/configs/accelerate/deepspeed_zero3.yaml \\
        examples/train.py --config examples/configs/deepsearch_qwen3_4b.yaml

Overrides follow YAML rules, e.g. ``max_steps=5 optim.lr=1e-6 rollout.max_turns=2``. See docs/trainer.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

try:
    import rlf_trainer  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`: use the repository's packages
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlf_trainer.config import ConfigError, load_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", required=True, help="YAML config (see examples/configs/)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. optim.lr=1e-6")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    from rlf_trainer.trainer import GRPOTrainer  # torch & co. load after the config is known to be good

    trainer = GRPOTrainer(config)
    history = trainer.train()
    if not trainer.accelerator.is_main_process:
        return 0
    last = history.records[-1] if history.records else {}
    evaluation = "".join(
        f"; {key}={value:.4f}" for key, value in last.items() if key in ("eval/reward", "eval/accuracy")
    )
    print(
        f"done: {len(history.records)} steps logged in {config.run_dir}; "
        f"last reward/mean={last.get('reward/mean', float('nan')):.4f}{evaluation}"
    )
    if config.checkpoint.save_model:
        print(f"model: {config.model_dir} (a Hugging Face folder: from_pretrained, rlf-serve, vLLM)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
