"""The asynchronous rollout: every episode is its own coroutine, with no batch-wide barrier per turn.

Each episode generates its next turn (``await policy.agenerate``), steps its own env the moment
that turn is done (``await envs.astep_one(i, text)``) and submits its next turn the moment its
tool results are back. With an engine that batches continuously (vLLM, through
:class:`~rlf_trainer.policy.engine_loop.EngineLoop`), generation of some episodes overlaps the
tool calls of others, and no turn waits for the slowest generation or the slowest tool of the
whole batch. The sequences are built exactly as in the lockstep rollout (:mod:`rlf_trainer.rollout.lockstep`):
generated ids as sampled (loss 1, sampler logprobs), tool and user-message deltas from the chat
template (loss 0; a dialogue env's simulated user turns run inside ``astep_one``),
the same length budget and finish reasons.

Seeds: the request of env ``i`` at turn ``t`` uses ``seeds.for_request(i, t)`` (:mod:`rlf_trainer.seeds`,
the same seeds as the lockstep rollout), so every request has its own seed and a batch is
reproducible wherever the engine's sampling is.

``max_concurrent_episodes`` caps the episodes in flight at once (the others wait to start), e.g.
to bound tool-server load or engine memory.

Example:
    >>> envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=8, autoreset_mode="Disabled")  # doctest: +SKIP
    >>> batch = run_async_rollout(envs, vllm_policy, prompt_indices=[3, 7], group_size=4,
    ...                           sampling=SamplingParams(max_new_tokens=256, seed=0),
    ...                           max_total_tokens=2048)                                   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlf_trainer.policy.async_policy import AsyncPolicy, as_async_policy
from rlf_trainer.policy.base import SamplingParams
from rlf_trainer.rollout.batch import RolloutBatch, to_batch
from rlf_trainer.rollout.trajectory import (
    RolloutError,
    Trajectory,
    TurnContext,
    add_completion,
    apply_step,
    start_rollout,
)
from rlf_trainer.seeds import SeedKey


@dataclass
class EpisodeTimeline:
    """Seconds one episode spent in each turn's generation and env step (for the critical path)."""

    generate_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)

    @property
    def critical_path_s(self) -> float:
        return sum(self.generate_s) + sum(self.step_s)


def run_async_rollout(envs: Any, policy: Any, prompt_indices: Sequence[int], **kwargs: Any) -> RolloutBatch:
    """:func:`arun_rollout` from synchronous code (its own event loop for the duration)."""
    return asyncio.run(arun_rollout(envs, policy, prompt_indices, **kwargs))


async def arun_rollout(
    envs: Any,
    policy: Any,
    prompt_indices: Sequence[int],
    *,
    group_size: int,
    sampling: SamplingParams,
    max_total_tokens: int,
    split: str = "train",
    seeds: SeedKey | None = None,
    max_concurrent_episodes: int | None = None,
) -> RolloutBatch:
    """Play ``prompt_indices[b]`` x ``group_size`` episodes, one coroutine each; see the module docs.

    ``envs`` is a vector env with ``astep_one`` (docs/env_contract.md), made with autoreset mode
    "Disabled". ``batch.timings`` holds the rollout's wall time (``total``), the busy seconds of
    generation and env steps summed over episodes, and ``critical_path`` (the slowest episode's
    own generate + step time: what no scheduling can beat); ``batch.timelines`` the per-episode detail.
    """
    if not callable(getattr(envs, "astep_one", None)):
        raise RolloutError("the async rollout needs a vector env with astep_one (docs/env_contract.md)")
    num_envs = int(envs.num_envs)
    engine = as_async_policy(policy)
    tokenizer = engine.tokenizer
    started = time.perf_counter()
    begun = start_rollout(envs, tokenizer, prompt_indices, group_size, sampling, split)
    trajectories, end_id, sampling = begun.trajectories, begun.end_id, begun.sampling
    timelines = [EpisodeTimeline() for _ in range(num_envs)]
    context = TurnContext(tokenizer, end_id, max_total_tokens)
    key = seeds or (SeedKey(sampling.seed) if sampling.seed is not None else None)
    episode = _Episode(envs, engine, sampling, context, key)
    limit = asyncio.Semaphore(max_concurrent_episodes or num_envs)

    async def play(i: int) -> None:
        async with limit:
            await episode.play(i, trajectories[i], timelines[i])

    await asyncio.gather(*(play(i) for i in range(num_envs)))
    timings = {
        "generate": sum(sum(t.generate_s) for t in timelines),
        "tools+reward": begun.reset_s + sum(sum(t.step_s) for t in timelines),
        "tokenize": begun.tokenize_s + episode.tokenize_s,
        "critical_path": max(t.critical_path_s for t in timelines),
        "total": time.perf_counter() - started,
    }
    batch = to_batch(trajectories, tokenizer, end_id, timings)
    batch.timelines = timelines
    return batch


@dataclass
class _Episode:
    """How one episode is played; the settings its rollout shares."""

    envs: Any
    policy: AsyncPolicy
    sampling: SamplingParams
    context: TurnContext
    seeds: SeedKey | None
    tokenize_s: float = 0.0

    async def play(self, i: int, traj: Trajectory, timeline: EpisodeTimeline) -> None:
        turn = 0
        while not traj.done:
            if len(traj.token_ids) >= self.context.max_total_tokens:
                traj.force_finish = True
            action, completion = "", None
            if not traj.force_finish:
                seed = None if self.seeds is None else self.seeds.for_request(i, turn)
                t0 = time.perf_counter()
                completion = await self.policy.agenerate(
                    list(traj.token_ids), dataclasses.replace(self.sampling, seed=seed)
                )
                timeline.generate_s.append(time.perf_counter() - t0)
                if add_completion(traj, completion, self.context.max_total_tokens):
                    action = completion.text
                else:
                    completion = None
            t0 = time.perf_counter()
            _, reward, terminated, truncated, info = await self.envs.astep_one(i, action)
            timeline.step_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            apply_step(
                traj, i, (float(reward), bool(terminated), bool(truncated), info), completion, self.context
            )
            self.tokenize_s += time.perf_counter() - t0
            turn += 1
