"""The lockstep rollout: multi-turn episodes over a Gymnasium vector env, one batched generate per turn.

``run_rollout`` resets ``num_envs`` envs (``G`` copies of each of ``B`` prompts), then per turn makes
ONE batched ``policy.generate`` call over every still-active episode and ONE ``envs.step`` with the
generated texts (finished envs get ``""``: with autoreset "Disabled" stepping them is a no-op).

Each episode's token sequence is built without ever re-tokenizing what the model wrote::

    prompt ids (chat template on info["messages"] + info["tools"])      loss 0, logprob 0
    turn 1: generated ids, exactly as sampled                          loss 1, sampler logprobs
            tool-result delta ids (chat.tool_delta_ids)                 loss 0, logprob 0
    turn 2: ...
            (a dialogue env: a turn without a tool call is answered by its user simulator, and
            the delta is that user message, info["user_message"], also loss 0)

Length budget: when the next turn would start at or beyond ``max_total_tokens`` (prompt + turns +
tool results), or a turn's generation runs past it (its ids are cut at the budget), the episode is
force-finished: the env is stepped with an empty assistant turn, which ends it as an answer-less
episode and scores it (0 for answer-matching rewards; a task's format or tool reward may still
give credit). Its finish reason is ``"max_total_tokens"``.

The asynchronous rollout (:mod:`rlf_trainer.rollout.async_rollout`) builds the same sequences without the
per-turn barrier; both share :mod:`rlf_trainer.rollout.trajectory`.

Example:
    >>> envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=8, autoreset_mode="Disabled")  # doctest: +SKIP
    >>> batch = run_rollout(envs, policy, prompt_indices=[3, 7], group_size=4,
    ...                     sampling=SamplingParams(max_new_tokens=256, seed=0),
    ...                     max_total_tokens=2048)                                         # doctest: +SKIP
    >>> batch.input_ids.shape[0], batch.rewards.shape                                      # doctest: +SKIP
    (8, torch.Size([8]))
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from rlf_trainer.policy.base import Completion, Policy, SamplingParams
from rlf_trainer.rollout.batch import RolloutBatch, to_batch
from rlf_trainer.rollout.trajectory import (
    FINISH_ANSWER,
    FINISH_MAX_TOKENS,
    FINISH_MAX_TURNS,
    FINISH_SIM_ERROR,
    EpisodeStats,
    RolloutError,
    TurnContext,
    add_completion,
    apply_step,
    env_info,
    start_rollout,
    turn_end_id,
)
from rlf_trainer.seeds import SeedKey

# the names the trainer, scripts and tests import from here
__all__ = [
    "FINISH_ANSWER",
    "FINISH_MAX_TOKENS",
    "FINISH_MAX_TURNS",
    "FINISH_SIM_ERROR",
    "EpisodeStats",
    "RolloutBatch",
    "RolloutError",
    "env_info",
    "run_rollout",
    "turn_end_id",
]

# ---------------------------------------------------------------------------------------------------
# The rollout
# ---------------------------------------------------------------------------------------------------


def generate_turn(
    policy: Policy,
    trajectories: list[Any],
    sampling: SamplingParams,
    key: SeedKey | None,
    turn: int,
    max_total_tokens: int,
) -> tuple[list[str], dict[int, Completion]]:
    """One batched ``generate`` over every live episode; returns each env's action text (empty for
    the others) and the completions that were kept."""
    actions = [""] * len(trajectories)
    completions: dict[int, Completion] = {}
    for traj in trajectories:
        if not traj.done and len(traj.token_ids) >= max_total_tokens:
            traj.force_finish = True  # e.g. a prompt longer than the whole budget
    generating = [i for i, traj in enumerate(trajectories) if not traj.done and not traj.force_finish]
    if not generating:
        return actions, completions
    params = dataclasses.replace(
        sampling,
        seed=None,
        seeds=None if key is None else tuple(key.for_request(i, turn) for i in generating),
    )
    outputs = policy.generate([trajectories[i].token_ids for i in generating], params)
    if len(outputs) != len(generating):
        raise RolloutError(f"policy returned {len(outputs)} completions for {len(generating)} prompts")
    for i, completion in zip(generating, outputs, strict=True):
        if add_completion(trajectories[i], completion, max_total_tokens):
            actions[i] = completion.text
            completions[i] = completion
    return actions, completions


def run_rollout(
    envs: Any,
    policy: Policy,
    prompt_indices: Sequence[int],
    *,
    group_size: int,
    sampling: SamplingParams,
    max_total_tokens: int,
    split: str = "train",
    seeds: SeedKey | None = None,
) -> RolloutBatch:
    """Play one batch of episodes: ``prompt_indices[b]`` x ``group_size`` samples = ``envs.num_envs``.

    ``envs`` is any Gymnasium vector env following docs/env_contract.md, made with autoreset mode
    "Disabled". Env ``i``'s request at turn ``t`` is seeded ``seeds.for_request(i, t)``
    (:mod:`rlf_trainer.seeds`; with ``seeds`` None and ``sampling.seed`` set, ``SeedKey(sampling.seed)``),
    so a batch is reproducible and no two requests share a seed.
    """
    tokenizer = policy.tokenizer
    started = time.perf_counter()
    begun = start_rollout(envs, tokenizer, prompt_indices, group_size, sampling, split)
    trajectories, end_id, sampling = begun.trajectories, begun.end_id, begun.sampling
    timings = {"generate": 0.0, "tools+reward": begun.reset_s, "tokenize": begun.tokenize_s}

    context = TurnContext(tokenizer, end_id, max_total_tokens)
    turn = 0
    while not all(traj.done for traj in trajectories):
        key = seeds or (SeedKey(sampling.seed) if sampling.seed is not None else None)
        t0 = time.perf_counter()
        actions, completions = generate_turn(policy, trajectories, sampling, key, turn, max_total_tokens)
        timings["generate"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        _, rewards, terminated, truncated, infos = envs.step(actions)
        timings["tools+reward"] += time.perf_counter() - t0

        t0 = time.perf_counter()
        for i, traj in enumerate(trajectories):
            if not traj.done:
                step = (float(rewards[i]), bool(terminated[i]), bool(truncated[i]), env_info(infos, i))
                apply_step(traj, i, step, completions.get(i), context)
        timings["tokenize"] += time.perf_counter() - t0
        turn += 1

    timings["total"] = time.perf_counter() - started
    return to_batch(trajectories, tokenizer, end_id, timings)
