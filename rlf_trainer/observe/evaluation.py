"""Evaluation on an env's test prompts: the trainer's periodic eval and ``rlf-eval`` run this one code.

- :class:`EvalSpec`: what to play (split, ``num_prompts`` prompts x ``samples`` each, sampling,
  seeds, ``pass@k``); :meth:`EvalSpec.of_config` is the trainer's eval (``eval.*``, one sample a
  prompt).
- :func:`eval_plan`: the episodes. The prompts are a fixed sample of the split
  (:func:`~rlf_trainer.observe.metrics.eval_prompt_indices`, ``eval.sample_seed``); episode
  ``p * samples + s`` is sample ``s`` of the eval list's prompt ``p`` and seeds that episode's
  requests, so one process and several processes (episodes dealt round-robin) play the same eval.
- :func:`play_eval` plays this process's share with a policy (a
  :class:`~rlf_trainer.rollout.collect.RolloutState`, the token rollouts);
  :func:`aplay_eval_text` plays them all with a text agent (an OpenAI-compatible endpoint) through
  the env's async API, with the same seeds.
- :func:`eval_metrics`: ``eval/*`` (per ``group_by`` value too) and, when ``pass_k`` is asked,
  ``eval/pass@k`` and ``eval/avg@n`` (:mod:`rlf_trainer.observe.pass_k`), overall and per group.

:func:`evaluate` is the trainer's eval: ``eval/*`` as the mean over processes, and a few
transcripts appended to ``eval_samples.jsonl``.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlf_trainer.config import Config
from rlf_trainer.observe.metrics import (
    append_jsonl,
    eval_prompt_indices,
    grouped_metrics,
    rollout_metrics,
    sample_records,
)
from rlf_trainer.observe.pass_k import success_rates
from rlf_trainer.policy.base import SamplingParams
from rlf_trainer.rollout.collect import RolloutState, play
from rlf_trainer.rollout.text_rollout import TextAgent, play_text_episode
from rlf_trainer.rollout.trajectory import EpisodeStats
from rlf_trainer.run.distributed import mean_over_processes
from rlf_trainer.seeds import SeedKey

Progress = Callable[[int], None]  # called with the number of episodes that just finished


@dataclass(frozen=True)
class EvalSpec:
    """What an evaluation plays: ``num_prompts`` prompts of ``split`` (a fixed sample, see
    :func:`eval_plan`) x ``samples`` each, at ``temperature``/``top_p``, ``max_new_tokens`` a turn.

    Requests are seeded by ``(seed, step, episode, turn)`` (:mod:`rlf_trainer.seeds`, split
    ``eval``). ``group_by``: a task metadata key whose values get metrics of their own.
    ``pass_k``: the k of ``eval/pass@k`` (each at most ``samples``; none: no pass@k metrics). An
    episode is a success when the env says it is correct (``em``/``acc``), or, for an env that
    reports neither, when its reward reaches ``success_reward``.

    Example:
        >>> EvalSpec(split="test", num_prompts=8, samples=2, pass_k=(1, 4))
        Traceback (most recent call last):
        ...
        ValueError: pass@4 needs at least 4 samples a prompt (samples=2)
    """

    split: str
    num_prompts: int
    samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    sample_seed: int = 0
    step: int = 0
    group_by: str | None = None
    pass_k: tuple[int, ...] = ()
    success_reward: float = 1.0

    def __post_init__(self) -> None:
        if self.num_prompts < 1 or self.samples < 1:
            raise ValueError(
                f"num_prompts and samples must be >= 1, got {self.num_prompts} and {self.samples}"
            )
        for k in self.pass_k:
            if not 1 <= k <= self.samples:
                raise ValueError(f"pass@{k} needs at least {k} samples a prompt (samples={self.samples})")

    @classmethod
    def of_config(cls, config: Config, step: int = 0) -> EvalSpec:
        """The trainer's eval after ``step`` steps: ``eval.num_prompts`` test prompts, one sample each.

        Example:
            >>> from rlf_trainer.config import load_config
            >>> spec = EvalSpec.of_config(load_config(None, ["model.path=m", "eval.num_prompts=4"]), step=3)
            >>> spec.split, spec.num_prompts, spec.samples, spec.temperature, spec.step
            ('test', 4, 1, 0.0, 3)
        """
        return cls(
            split=config.env.test_split,
            num_prompts=config.eval.num_prompts,
            temperature=config.eval.temperature,
            top_p=config.eval.top_p,
            max_new_tokens=config.rollout.max_new_tokens,
            seed=config.seed,
            sample_seed=config.eval.sample_seed,
            step=step,
            group_by=config.eval.group_by,
        )

    def sampling(self) -> SamplingParams:
        """The policy's sampling settings (the seeds come per request)."""
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p
        )

    def seeds(self, first_episode: int, stride: int = 1) -> SeedKey:
        """The seeds of a batch whose env ``i`` plays episode ``first_episode + i * stride``."""
        return SeedKey(self.seed, self.step, split="eval", first_episode=first_episode, episode_stride=stride)

    def success(self, stats: EpisodeStats) -> bool:
        """Whether an episode counts as correct for pass@k and avg@n (see the class docs)."""
        return stats.correct if stats.correct is not None else stats.reward >= self.success_reward


@dataclass(frozen=True)
class PlannedEpisode:
    """One episode of an evaluation: sample ``sample`` of the eval list's prompt ``prompt``, which is
    instance ``task_index`` of the split; ``episode`` (``prompt * samples + sample``) seeds it."""

    episode: int
    prompt: int
    task_index: int
    sample: int


@dataclass
class EvalEpisode:
    """A played episode of an evaluation: what was planned, its stats and its transcript."""

    planned: PlannedEpisode
    stats: EpisodeStats
    transcript: list[dict[str, Any]]


def eval_plan(num_tasks: int, spec: EvalSpec) -> list[PlannedEpisode]:
    """Every episode of the evaluation, in episode order: each prompt's samples together.

    Example:
        >>> plan = eval_plan(10, EvalSpec(split="test", num_prompts=2, samples=2))
        >>> [(p.episode, p.prompt, p.sample) for p in plan]
        [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
        >>> [p.task_index for p in plan] == [t for t in eval_prompt_indices(10, 2, seed=0) for _ in (0, 1)]
        True
    """
    prompts = eval_prompt_indices(num_tasks, spec.num_prompts, spec.sample_seed)
    return [
        PlannedEpisode(episode=p * spec.samples + s, prompt=p, task_index=task, sample=s)
        for p, task in enumerate(prompts)
        for s in range(spec.samples)
    ]


def play_eval(rollout: RolloutState, spec: EvalSpec, progress: Progress | None = None) -> list[EvalEpisode]:
    """Play this process's share of the eval (episodes dealt round-robin) with the rollout's policy.

    The envs play ``envs.num_envs`` episodes at a time (the last batch padded with copies of its
    last prompt, which are dropped). Needs no model, optimizer or run folder: only what playing needs.
    """
    acc = rollout.accelerator
    mine = eval_plan(rollout.envs.num_tasks(spec.split), spec)[acc.process_index :: acc.num_processes]
    num_envs = int(rollout.envs.num_envs)
    played: list[EvalEpisode] = []
    rollout.policy.wake_up()
    for start in range(0, len(mine), num_envs):
        chunk = mine[start : start + num_envs]
        tasks = [p.task_index for p in chunk]
        padded = tasks + [tasks[-1]] * (num_envs - len(chunk))
        # env i of the batch plays episode chunk[0].episode + i * processes (the round-robin deal)
        seeds = spec.seeds(chunk[0].episode, acc.num_processes)
        batch = play(rollout, padded, spec.sampling(), spec.split, group_size=1, seeds=seeds)
        played += [
            EvalEpisode(p, s, t) for p, s, t in zip(chunk, batch.stats, batch.transcripts, strict=False)
        ]
        if progress is not None:
            progress(len(chunk))
    rollout.policy.sleep()
    return played


async def aplay_eval_text(
    envs: Any, agent: TextAgent, spec: EvalSpec, progress: Progress | None = None
) -> list[EvalEpisode]:
    """Play every episode of the eval with a text agent, ``envs.num_envs`` at a time (each env takes
    the next episode the moment its last one ends); returned in episode order.

    Episode ``e``'s request at turn ``t`` has the seed the token rollouts give it, so an endpoint
    that honours ``seed`` plays the same eval twice.
    """
    plan = eval_plan(envs.num_tasks(spec.split), spec)
    num_envs = min(int(envs.num_envs), len(plan))
    # areset_one draws from the env's current split, and a reset that names a split sets it
    # (docs/env_contract.md); this reset only does that: every episode below resets its env again.
    first = [plan[min(i, len(plan) - 1)].task_index for i in range(int(envs.num_envs))]
    envs.reset(options={"split": spec.split, "task_indices": first})
    waiting = collections.deque(plan)
    played: dict[int, EvalEpisode] = {}

    async def worker(slot: int) -> None:
        while waiting:
            planned = waiting.popleft()
            stats, transcript = await play_text_episode(
                envs, slot, agent, planned.task_index, spec.seeds(planned.episode)
            )
            played[planned.episode] = EvalEpisode(planned, stats, transcript)
            if progress is not None:
                progress(1)

    await asyncio.gather(*(worker(slot) for slot in range(num_envs)))
    return [played[p.episode] for p in plan]


def eval_metrics(episodes: Sequence[EvalEpisode], spec: EvalSpec) -> dict[str, float]:
    """``eval/*`` episode metrics (:func:`~rlf_trainer.observe.metrics.rollout_metrics`, the mean
    reward as ``eval/reward``), per ``spec.group_by`` value, and pass@k / avg@n when ``spec.pass_k``
    names any k (each prompt's samples must all be in ``episodes``).

    Example:
        >>> spec = EvalSpec(split="test", num_prompts=2, samples=2, group_by="hops", pass_k=(1, 2))
        >>> def played(prompt, sample, correct, hops):
        ...     stats = EpisodeStats("t", 0, reward=float(correct), correct=correct, task_metadata={"hops": hops})
        ...     return EvalEpisode(PlannedEpisode(prompt * 2 + sample, prompt, prompt, sample), stats, [])
        >>> m = eval_metrics([played(0, 0, True, 1), played(0, 1, False, 1), played(1, 0, False, 2),
        ...                   played(1, 1, False, 2)], spec)
        >>> m["eval/reward"], m["eval/pass@1"], m["eval/pass@2"], m["eval/avg@2"], m["eval/hops=1/pass@2"]
        (0.25, 0.25, 0.5, 0.25, 1.0)
    """
    stats = [e.stats for e in episodes]
    metrics = rollout_metrics(stats, prefix="eval/")
    metrics = {("eval/reward" if k == "eval/reward/mean" else k): v for k, v in metrics.items()}
    if spec.group_by:
        metrics |= grouped_metrics(stats, spec.group_by)
    if spec.pass_k and episodes:
        metrics |= _success_metrics(episodes, spec, "eval/")
        if spec.group_by:
            for value, members in _by_group(episodes, spec.group_by).items():
                metrics |= _success_metrics(members, spec, f"eval/{spec.group_by}={value}/")
    return metrics


def _success_metrics(episodes: Sequence[EvalEpisode], spec: EvalSpec, prefix: str) -> dict[str, float]:
    by_prompt: dict[int, list[bool]] = {}
    for e in episodes:
        by_prompt.setdefault(e.planned.prompt, []).append(spec.success(e.stats))
    return {prefix + name: value for name, value in success_rates(by_prompt, spec.pass_k).items()}


def _by_group(episodes: Sequence[EvalEpisode], key: str) -> dict[str, list[EvalEpisode]]:
    groups: dict[str, list[EvalEpisode]] = {}
    for e in episodes:
        if key in e.stats.task_metadata:
            groups.setdefault(str(e.stats.task_metadata[key]), []).append(e)
    return dict(sorted(groups.items()))


def episode_counts(episodes: Sequence[EvalEpisode]) -> dict[str, Any]:
    """Counts beside the rates of :func:`eval_metrics`: episodes, tool calls, tool errors by kind,
    finish reasons.

    Example:
        >>> s = EpisodeStats("t", 0, tool_calls=3, tool_errors=1, error_kinds=["timeout"], finish_reason="answer")
        >>> episode_counts([EvalEpisode(PlannedEpisode(0, 0, 0, 0), s, [])])
        {'episodes': 1, 'tool_calls': 3, 'tool_errors': {'timeout': 1}, 'finish_reasons': {'answer': 1}}
    """
    stats = [e.stats for e in episodes]
    return {
        "episodes": len(stats),
        "tool_calls": sum(s.tool_calls for s in stats),
        "tool_errors": dict(sorted(Counter(k for s in stats for k in s.error_kinds).items())),
        "finish_reasons": dict(sorted(Counter(s.finish_reason for s in stats).items())),
    }


def episode_records(episodes: Sequence[EvalEpisode], spec: EvalSpec) -> list[dict[str, Any]]:
    """One JSON record per episode (the samples file of ``rlf-eval``): which prompt and sample, the
    group value, reward, success, what happened, and the transcript.

    Example:
        >>> s = EpisodeStats("t3", 0, reward=1.0, correct=True, task_metadata={"hops": 2}, finish_reason="answer")
        >>> record = episode_records([EvalEpisode(PlannedEpisode(5, 2, 17, 1), s, [])], EvalSpec("test", 4, 2, group_by="hops"))[0]
        >>> record["prompt_index"], record["sample_index"], record["task_index"], record["group"], record["correct"]
        (2, 1, 17, '2', True)
    """
    transcripts = [renumber_tool_call_ids(e.transcript) for e in episodes]
    stats = [e.stats for e in episodes]
    base = sample_records(stats, transcripts, step=spec.step, limit=len(episodes), kind="eval")
    records = []
    for e, record in zip(episodes, base, strict=True):
        meta = e.stats.task_metadata
        group = str(meta[spec.group_by]) if spec.group_by and spec.group_by in meta else None
        records.append(
            {
                "prompt_index": e.planned.prompt,
                "sample_index": e.planned.sample,
                "task_index": e.planned.task_index,
                "task_id": e.stats.task_id,
                "group": group,
                "reward": e.stats.reward,
                "correct": spec.success(e.stats),
                "tool_errors": list(e.stats.error_kinds),
                **{
                    k: v for k, v in record.items() if k not in ("kind", "step", "task_id", "group", "reward")
                },
            }
        )
    return records


def renumber_tool_call_ids(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The transcript with its tool call ids renumbered ``call_0``, ``call_1``, ... in order of
    appearance. The env numbers calls with one counter per process, so the ids of concurrent
    episodes depend on timing; renumbered, a seeded eval writes the same samples file twice.

    Example:
        >>> t = [{"role": "assistant", "content": "", "tool_calls": [{"id": "call_7", "type": "function"}]},
        ...      {"role": "tool", "tool_call_id": "call_7", "content": "ok"}]
        >>> [m.get("tool_call_id") or m["tool_calls"][0]["id"] for m in renumber_tool_call_ids(t)]
        ['call_0', 'call_0']
    """
    ids: dict[str, str] = {}

    def new_id(old: Any) -> Any:
        return ids.setdefault(old, f"call_{len(ids)}") if isinstance(old, str) else old

    out = []
    for message in transcript:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [{**call, "id": new_id(call.get("id"))} for call in message["tool_calls"]]
        if "tool_call_id" in message:
            message["tool_call_id"] = new_id(message["tool_call_id"])
        out.append(message)
    return out


def gather_episodes(accelerator: Any, episodes: list[EvalEpisode]) -> list[EvalEpisode]:
    """Every process's episodes, in episode order, on every process (one process: as they are)."""
    if accelerator.num_processes == 1:
        return episodes
    from accelerate.utils import gather_object

    return sorted(gather_object(episodes), key=lambda e: e.planned.episode)


def evaluate(rollout: RolloutState, step: int, samples_path: Path | None = None) -> dict[str, float]:
    """The trainer's eval after ``step`` steps (:meth:`EvalSpec.of_config`): ``eval/*`` metrics, the
    mean over processes, and ``time/eval``.

    With ``samples_path`` (and ``logging.samples_jsonl``) the first ``eval.samples_to_log``
    transcripts are appended there.
    """
    cfg, acc = rollout.config, rollout.accelerator
    spec = EvalSpec.of_config(cfg, step)
    started = time.perf_counter()
    episodes = play_eval(rollout, spec)
    metrics = eval_metrics(episodes, spec)
    metrics["time/eval"] = time.perf_counter() - started  # not part of time/step
    metrics = mean_over_processes(acc, metrics)
    if cfg.logging.samples_jsonl and samples_path is not None:
        stats, transcripts = [e.stats for e in episodes], [e.transcript for e in episodes]
        records = sample_records(stats, transcripts, step=step, limit=cfg.eval.samples_to_log, kind="eval")
        if acc.num_processes > 1:  # every process evaluated its share of the prompts
            from accelerate.utils import gather_object

            records = gather_object(records)[: cfg.eval.samples_to_log]
        if acc.is_main_process:
            append_jsonl(samples_path, records)
    return metrics


__all__ = [
    "EvalEpisode",
    "EvalSpec",
    "PlannedEpisode",
    "aplay_eval_text",
    "episode_counts",
    "episode_records",
    "eval_metrics",
    "eval_plan",
    "evaluate",
    "gather_episodes",
    "play_eval",
    "renumber_tool_call_ids",
]
