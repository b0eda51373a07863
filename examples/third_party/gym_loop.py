"""A plain Gymnasium loop over an RLF vector env: the whole contract a third-party trainer relies on.

No trainer and no model: the ``oracle`` agent replays the generated DeepSearch world's own solution
(one search per hop, then the answer: reward 1), and ``--agent random`` mixes well-formed calls,
broken JSON, unknown tools and answers, to show that a bad action becomes an error observation and
an ``info["errors"]`` kind, never an exception. Put your policy's generate call where the agent
acts and this is a rollout loop.

Run::

    python examples/third_party/gym_loop.py --num-envs 8 --episodes 16
    python examples/third_party/gym_loop.py --agent random --env RLF/DeepSearch-v0
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from typing import Any

import gymnasium as gym

import rlf_envs  # noqa: F401  (registers the RLF/... ids)


def tool_call(name: str, **arguments: Any) -> str:
    """One assistant turn calling ``name`` in the default Hermes/Qwen3 format."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def oracle_act(world: Any, task_id: str, turn: int) -> str:
    """The world's solution: search each hop's entity in turn, then answer."""
    solution = world.solve(task_id)
    if turn < len(solution.queries):
        return tool_call("search", query=solution.queries[turn])
    return f"<answer>{solution.answer}</answer>"


def random_act(rng: random.Random, question: str) -> str:
    """Any turn a model might write, good or bad."""
    return rng.choice(
        [
            tool_call("search", query=question),
            tool_call("search", query=" ".join(rng.sample(question.split(), 2))),
            '<tool_call>{"name": "search", "arguments": {"query": </tool_call>',  # broken JSON
            tool_call("browse", url="http://example.com"),  # no such tool
            tool_call("search", top_k="three"),  # bad arguments
            "<answer>Paris</answer>",
        ]
    )


def run(
    env_id: str, num_envs: int, episodes: int, agent: str, seed: int = 0, **env_kwargs: Any
) -> dict[str, Any]:
    """Run ``episodes`` episodes on ``num_envs`` envs (NextStep autoreset) and return the tallies.

    ``agent`` is "oracle" (DeepSearch's generated world only) or "random".
    """
    rng = random.Random(seed)
    world = None
    if agent == "oracle":
        from rlf_envs.tasks.deepsearch.world_builder import generate_world

        world = generate_world(env_kwargs.get("world_seed", 0))
    envs = gym.make_vec(env_id, num_envs=num_envs, **env_kwargs)
    obs, infos = envs.reset(seed=seed)
    questions = list(obs)
    task_ids = list(infos["task_id"])
    turns = [0] * num_envs
    needs_reset = [False] * num_envs
    returns: list[float] = []
    error_kinds: Counter[str] = Counter()
    tool_calls = 0
    try:
        while len(returns) < episodes:
            actions = []
            for i in range(num_envs):
                if agent == "random":
                    actions.append(random_act(rng, questions[i]))
                else:
                    actions.append(oracle_act(world, task_ids[i], turns[i]))
            obs, rewards, terminated, truncated, infos = envs.step(actions)
            for i in range(num_envs):
                if needs_reset[i]:  # NextStep autoreset: this step reset env i, obs[i] is a new question
                    questions[i], task_ids[i], turns[i], needs_reset[i] = (
                        obs[i],
                        infos["task_id"][i],
                        0,
                        False,
                    )
                    continue
                turns[i] += 1
                if "tool_calls" in infos and infos["_tool_calls"][i]:
                    tool_calls += len(infos["tool_calls"][i])
                if "errors" in infos and infos["_errors"][i]:
                    error_kinds.update(infos["errors"][i])
                if terminated[i] or truncated[i]:
                    returns.append(float(rewards[i]))
                    needs_reset[i] = True
    finally:
        envs.close()
    returns = returns[:episodes]
    return {
        "episodes": len(returns),
        "mean_return": sum(returns) / len(returns),
        "solved": sum(r > 0 for r in returns),
        "tool_calls": tool_calls,
        "error_kinds": dict(error_kinds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="RLF/DeepSearch-v0")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--agent", choices=["oracle", "random"], default="oracle")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    summary = run(args.env, args.num_envs, args.episodes, args.agent, args.seed, max_turns=args.max_turns)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
