"""A look at RLF/DeepSearch-v0 without a model: scripted agents play episodes, transcripts are printed.

The oracle agent searches each entity along a question's chain (the queries come from the world
generator, so it knows what to look for) and answers from what the search tool returned; the
guessing agent answers at once without searching. Both run through the real env and search server.

Example:
    python -m rlf_envs.demo --episodes 2
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

import gymnasium as gym
import numpy as np

import rlf_envs  # noqa: F401  (registers ids)
from rlf_envs.core.env import render_transcript
from rlf_envs.info_keys import MESSAGES
from rlf_envs.tasks.deepsearch.oracle import oracle_turns
from rlf_envs.tasks.deepsearch.world_builder import generate_world


def play(env: gym.Env, turns: list[str], task_index: int) -> tuple[float, dict[str, Any], str]:
    env.reset(seed=0, options={"task_index": task_index, "split": "test"})
    reward, info = 0.0, {}
    for action in turns:
        _, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    return reward, info, render_transcript(info[MESSAGES])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--world-seed", type=int, default=0)
    args = parser.parse_args(argv)

    world = generate_world(args.world_seed)
    env = gym.make("RLF/DeepSearch-v0", world_seed=args.world_seed, split="test", max_turns=5)
    test_ids = [q.id for q in world.split("test")]
    rng = np.random.default_rng(0)
    picks = rng.choice(len(test_ids), size=min(args.episodes, len(test_ids)), replace=False)
    oracle_rewards, guess_rewards = [], []
    try:
        for index in picks:
            qid = test_ids[int(index)]
            reward, info, transcript = play(env, oracle_turns(world, qid), int(index))
            oracle_rewards.append(reward)
            print(f"=== oracle agent, question {qid}: reward {reward} ({info['reward_info']}) ===")
            print(re.sub(r"\n{3,}", "\n\n", transcript), "\n")
            guess, *_ = play(env, ["<answer>Paris</answer>"], int(index))
            guess_rewards.append(guess)
    finally:
        env.close()
    print(
        f"oracle agent mean reward {np.mean(oracle_rewards):.2f} over {len(picks)} test questions; "
        f"guessing agent {np.mean(guess_rewards):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
