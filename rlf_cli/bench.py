"""``rlf-bench``: ``env`` benchmarks the env half, ``train`` the trainer half (needs ``rlf[trainer]``).

This dispatcher lives outside both halves so that ``rlf_envs`` never imports ``rlf_trainer``.

Example:
    rlf-bench env --num-envs 256 --latency-ms 100 --steps 5 --json
    rlf-bench train --json
"""

from __future__ import annotations

import sys

USAGE = "usage: rlf-bench {env,train} [options]   (rlf-bench env --help, rlf-bench train --help)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "env":
        from rlf_envs.bench.cli import main as env_main

        return env_main(rest)
    if command == "train":
        try:
            from rlf_trainer.bench import main as train_main
        except ImportError as exc:
            print(
                f"rlf-bench train needs the trainer extra: pip install 'rlf[trainer]' ({exc})",
                file=sys.stderr,
            )
            return 2
        return train_main(rest)
    print(f"rlf-bench: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
