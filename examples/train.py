"""Train a tool-using policy with GRPO on an RLF env (the same as the ``rlf-train`` command).

Usage:
    python examples/train.py --config examples/configs/smollm2_cpu.yaml [dotted.key=value ...]
    accelerate launch --config_file examples/configs/accelerate/deepspeed_zero3.yaml \\
        examples/train.py --config examples/configs/deepsearch_qwen3_4b.yaml

Overrides follow YAML rules, e.g. ``max_steps=5 optim.lr=1e-6 rollout.max_turns=2``. See docs/trainer.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import rlf_trainer  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`: use the repository's packages
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlf_trainer.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
