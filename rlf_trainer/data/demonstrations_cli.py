"""``rlf-collect``: demonstrations from env rollouts, as chat-messages JSONL (see :mod:`rlf_trainer.data.demonstrations`).

Examples::

    rlf-collect RLF/DeepSearch-v0 --agent deepsearch-oracle --where hops=1 --limit 120 \\
        --out runs/deepsearch/sft_1hop.jsonl
    rlf-collect RLF/DeepSearch-v0 --agent deepsearch-oracle --max-hops 2 --where hops=1,2 --limit 144 \\
        --out runs/deepsearch/sft_1to2hops.jsonl    # the oracle never searches a third time
    rlf-collect RLF/SQL-v0 --base-url http://127.0.0.1:8000/v1 --model qwen --samples-per-task 4 \\
        --temperature 0.7 --threshold 1.0 --out sql_demos.jsonl --resume
    rlf-collect RLF/Codebook-v0 --model-path runs/learning/codebook/model --out codebook.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from rlf_trainer.data.demonstrations import (
    CollectError,
    CollectReport,
    build_agent,
    collect_demonstrations,
    select_tasks,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlf-collect", description=__doc__.splitlines()[0])
    p.add_argument("env_id", help="a registered env id, e.g. RLF/DeepSearch-v0")
    p.add_argument("--out", required=True, help="JSONL file to write (or append to with --resume)")
    p.add_argument(
        "--agent",
        help="scripted agent: 'deepsearch-oracle', 'deepsearch-oracle-kinds' (says what kind of thing each search found) or 'module:callable'",
    )
    p.add_argument("--base-url", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="the endpoint's model name (with --base-url)")
    p.add_argument("--model-path", help="a local Hugging Face model folder")
    p.add_argument("--max-hops", type=int,
                   help="deepsearch-oracle(-kinds): search at most this many times (a question with more hops is "
                        "answered after them, wrongly, and not kept at --threshold 1)")  # fmt: skip
    p.add_argument("--split", default="train", help="the task split to play (default: train)")
    p.add_argument("--where", action="append", default=[], metavar="KEY=V1,V2",
                   help="keep tasks whose metadata KEY is one of the values (repeatable), e.g. hops=1,2")  # fmt: skip
    p.add_argument("--limit", type=int, help="the first this many tasks (after --where)")
    p.add_argument(
        "--sample", type=int, help="this many tasks drawn at random (seeded by --seed) after --where"
    )
    p.add_argument("--samples-per-task", type=int, default=1)
    p.add_argument("--threshold", type=float, default=1.0, help="keep episodes whose return is >= this")
    p.add_argument("--seed", type=int, default=0, help="episode seeds are seed, seed+1, ... per task")
    p.add_argument("--concurrency", type=int, default=8, help="episodes in flight at once")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per assistant turn (model agents)")
    p.add_argument(
        "--env-kwargs", default="{}", help='JSON keyword arguments for gym.make, e.g. {"max_turns": 5}'
    )
    p.add_argument("--resume", action="store_true", help="append to --out, skipping episodes already there")
    return p


def _where(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise CollectError(f"--where {item!r}: use KEY=VALUE[,VALUE...]")
        out[key] = values.split(",")
    return out


def _progress_printer() -> Any:
    every = {"next": 0}

    def show(report: CollectReport, total: int) -> None:
        seen = report.played + report.already_done
        if seen >= every["next"] or seen == total:
            every["next"] = seen + max(1, total // 20)
            print(
                f"collect {seen}/{total}  kept {report.kept}  mean reward {report.mean_reward:.3f}",
                flush=True,
            )

    return show


def sample_tasks(tasks: list[int], count: int, seed: int) -> list[int]:
    """``count`` of ``tasks`` drawn without replacement, seeded, in their original order.

    Example:
        >>> sample_tasks(list(range(10)), 3, seed=0) == sample_tasks(list(range(10)), 3, seed=0)
        True
    """
    if count > len(tasks):
        raise CollectError(f"--sample {count}: only {len(tasks)} tasks match")
    picked = np.random.default_rng([seed, 0xC011EC7]).choice(len(tasks), size=count, replace=False)
    return [tasks[i] for i in sorted(int(i) for i in picked)]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        env_kwargs = json.loads(args.env_kwargs)
        if not isinstance(env_kwargs, dict):
            raise CollectError("--env-kwargs must be a JSON object")
        agent = build_agent(args.agent, base_url=args.base_url, model=args.model, model_path=args.model_path,
                            env_kwargs=env_kwargs, temperature=args.temperature, max_tokens=args.max_tokens,
                            max_hops=args.max_hops)  # fmt: skip
        tasks = _task_indices(args.env_id, args.split, _where(args.where), args.limit, env_kwargs)
        if args.sample is not None:
            tasks = sample_tasks(tasks, args.sample, args.seed)
        report = collect_demonstrations(
            args.env_id, agent, out=args.out, task_indices=tasks, split=args.split,
            samples_per_task=args.samples_per_task, seed=args.seed, threshold=args.threshold,
            concurrency=args.concurrency, env_kwargs=env_kwargs, resume=args.resume,
            progress=_progress_printer(),
        )  # fmt: skip
    except (CollectError, json.JSONDecodeError) as exc:
        print(f"rlf-collect: {exc}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0


def _task_indices(env_id: str, split: str, where: dict[str, list[str]], limit: int | None,
                  env_kwargs: dict[str, Any]) -> list[int]:  # fmt: skip
    import gymnasium as gym

    import rlf_envs  # noqa: F401  (registers the ids)

    try:
        env = gym.make(env_id, **env_kwargs)
    except gym.error.Error as exc:
        known = sorted(k for k in gym.registry if k.startswith("RLF/"))
        raise CollectError(
            f"unknown env id {env_id!r} ({exc}); registered RLF ids: {', '.join(known)}"
        ) from exc
    try:
        if split not in env.unwrapped.task.splits():
            raise CollectError(f"{env_id} has no split {split!r}; it has {env.unwrapped.task.splits()}")
        picked = select_tasks(env.unwrapped.task, split, where, limit)
    finally:
        env.close()
    if not picked:
        raise CollectError(f"no {split} task of {env_id} matches --where {where}")
    return picked


if __name__ == "__main__":
    sys.exit(main())
