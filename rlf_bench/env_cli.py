"""``rlf-bench env``: print env benchmark figures (``--json`` makes the last line one JSON object).

Example:
    rlf-bench env --num-envs 256 --latency-ms 100 --steps 5 --json
"""

from __future__ import annotations

import argparse
import json
import sys

from rlf_bench.env_bench import BenchSettings, format_report, run_env_bench


def _add_env_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--latency-ms", type=float, default=100.0)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    p.add_argument("--replicas", type=int, default=1, help="server processes (stdio) or sessions (http)")
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument(
        "--repeats", type=int, default=3, help="timed rounds each for the env and the floor (medians)"
    )
    p.add_argument("--floor-sessions", type=int, default=1, help="mcp.Client sessions for the raw-SDK floor")
    p.add_argument("--calls-per-step", type=int, default=1, help="tool calls in each env's action")
    p.add_argument(
        "--sequential-calls", type=int, default=32, help="calls timed for the scaled sequential loop"
    )
    p.add_argument("--json", action="store_true", help="end with one JSON line of all figures")
    p.add_argument(
        "--compare", action="store_true", help="also drive the peers (GEM, verifiers) on the same workload"
    )
    p.add_argument(
        "--compare-num-envs", default=None, help="comma list of num_envs for --compare (default: --num-envs)"
    )
    p.add_argument(
        "--peers",
        default="verifiers,gem",
        help="peers for --compare (their venvs: scripts/setup_peer_venvs.sh)",
    )
    p.add_argument("--plot", default=None, help="with --compare: write a steps/s vs num_envs PNG here")


def main(argv: list[str] | None = None) -> int:
    """``rlf-bench env [options]`` (``argv`` without the ``env`` word)."""
    parser = argparse.ArgumentParser(prog="rlf-bench env", description=__doc__.splitlines()[0])
    _add_env_arguments(parser)
    args = parser.parse_args(argv)
    settings = BenchSettings(
        num_envs=args.num_envs,
        latency_ms=args.latency_ms,
        steps=args.steps,
        transport=args.transport,
        replicas=args.replicas,
        jitter_ms=args.jitter_ms,
        sequential_calls=args.sequential_calls,
        calls_per_step=args.calls_per_step,
        floor_sessions=args.floor_sessions,
        repeats=args.repeats,
    )
    if args.compare:
        return _compare(args, settings)
    report = run_env_bench(settings)
    print(format_report(report), flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return 0


def _compare(args: argparse.Namespace, settings: BenchSettings) -> int:
    from rlf_bench.peers import format_compare, run_compare

    sizes = [int(n) for n in args.compare_num_envs.split(",")] if args.compare_num_envs else [args.num_envs]
    peers = tuple(p for p in args.peers.split(",") if p)
    report = run_compare(
        settings, sizes, peers=peers, progress=lambda m: print(m, file=sys.stderr, flush=True)
    )
    print(format_compare(report), flush=True)
    if args.plot:
        from rlf_bench.plot import plot_compare

        print(f"plot: {plot_compare(report, args.plot)}", flush=True)
    if args.json:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
