"""``rlf-bench``: ``env`` benchmarks the env half, ``simulator-checks`` the user-simulator checks; ``train`` and ``rollout`` the trainer half (``rlf[trainer]``).

This dispatcher lives outside both halves so that ``rlf_envs`` never imports ``rlf_trainer``.

Example:
    rlf-bench env --num-envs 256 --latency-ms 100 --steps 5 --json
    rlf-bench simulator-checks        # precision/recall of the simulator checks on the labelled set
    rlf-bench train --json
    rlf-bench rollout --json          # lockstep vs async rollout (vLLM: .venv-vllm on a CPU machine)
    rlf-bench profile --config examples/configs/smollm2_learn_cpu.yaml   # where generation's time goes
    rlf-bench floor --config examples/configs/smollm2_learn_cpu.yaml     # bf16's speed-up, bounded by its kernels
"""

from __future__ import annotations

import importlib
import sys

USAGE = "usage: rlf-bench {env,simulator-checks,train,rollout,profile,floor} [options]   (rlf-bench COMMAND --help)"
TRAINER_COMMANDS = {
    "train": "rlf_bench.train_bench",
    "rollout": "rlf_bench.rollout_bench",
    "profile": "rlf_bench.rollout_profile",
    "floor": "rlf_bench.kernel_floor",
}
# run on the malloc rlf-train uses (its timed child does): the kernels they replay are timed in this process
FAST_MALLOC_COMMANDS = frozenset({"floor"})


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "env":
        from rlf_bench.env_cli import main as env_main

        return env_main(rest)
    if command == "simulator-checks":
        from rlf_bench.sim_checks_bench import main as sim_checks_main

        return sim_checks_main(rest)
    if command in TRAINER_COMMANDS:
        try:
            import rlf_trainer.trainer  # noqa: F401  (torch, transformers, accelerate)
        except ImportError as exc:
            print(
                f"rlf-bench {command} needs the trainer extra: pip install 'rlf[trainer]' ({exc})",
                file=sys.stderr,
            )
            return 2
        if from_command_line and command in FAST_MALLOC_COMMANDS:
            from rlf_trainer.run.allocator import relaunch_with_fast_allocator

            relaunch_with_fast_allocator()
        return importlib.import_module(TRAINER_COMMANDS[command]).main(rest)
    print(f"rlf-bench: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
