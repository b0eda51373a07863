"""``rlf-train``: train a tool-using policy with GRPO on an RLF env, from a YAML config.

Usage::

    rlf-train --config examples/configs/smollm2_cpu.yaml [dotted.key=value ...]
    accelerate launch --config_file examples/configs/accelerate/deepspeed_zero3.yaml \\
        -m rlf_trainer.cli --config examples/configs/deepsearch_qwen3_4b.yaml

``python examples/train.py`` is the same command. Overrides follow YAML rules, e.g.
``max_steps=5 optim.lr=1e-6 rollout.max_turns=2``. See docs/trainer.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from rlf_trainer.config import ConfigError, load_config
from rlf_trainer.run.allocator import relaunch_with_fast_allocator


def main(argv: list[str] | None = None) -> int:
    """Parse ``--config`` and overrides, train, print where the run went; 2 on a bad config,
    3 when the prompt does not fit the budget or a ``health.fail_on`` check trips."""
    parser = argparse.ArgumentParser(
        prog="rlf-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    if argv is None:  # a command, not a call: on a CPU a caching malloc is worth a re-exec
        relaunch_with_fast_allocator()
    from rlf_trainer.observe.budget import PromptBudgetError
    from rlf_trainer.observe.health import HealthCheckFailed
    from rlf_trainer.trainer import Trainer  # torch & co. load after the config is known to be good

    try:
        trainer = Trainer(config)
        history = trainer.train()
    except ConfigError as exc:  # what only the start can find: a tracker not installed, a process count
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except (PromptBudgetError, HealthCheckFailed) as exc:
        print(f"rlf-train: {exc}", file=sys.stderr)
        return 3
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
