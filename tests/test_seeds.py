"""One seed function for every sample (issue 19.2): no two requests of a run share a seed, a
process count does not change an episode's seed, and both rollouts seed a request alike."""

from __future__ import annotations

import itertools

import gymnasium as gym
import pytest

import rlf_envs  # noqa: F401  (registers the env ids)
from rlf_trainer.policy import Completion, SamplingParams
from rlf_trainer.rollout import chat
from rlf_trainer.rollout.async_rollout import run_async_rollout
from rlf_trainer.rollout.lockstep import run_rollout
from rlf_trainer.seeds import SeedKey, sample_seed


def test_no_two_requests_of_a_run_share_a_seed():
    keys = list(itertools.product(("train", "eval"), range(4), range(3), range(16), range(4)))
    seeds = {sample_seed(7, split=s, step=k, refill_round=r, episode=e, turn=t) for s, k, r, e, t in keys}
    assert len(seeds) == len(keys)
    assert all(0 <= s < 2**63 for s in seeds)
    assert sample_seed(7, step=0, episode=0, turn=0) != sample_seed(8, step=0, episode=0, turn=0)


@pytest.mark.parametrize("processes", [2, 4])
def test_an_episode_keeps_its_seed_whatever_the_process_count(processes):
    episodes, turns = 8, 3
    one = [[SeedKey(0, step=5).for_request(e, t) for t in range(turns)] for e in range(episodes)]
    per_process = episodes // processes
    many = [
        [SeedKey(0, step=5, first_episode=rank * per_process).for_request(i, t) for t in range(turns)]
        for rank in range(processes)
        for i in range(per_process)
    ]
    assert many == one
    ranks = [
        {SeedKey(0, step=5, first_episode=rank * per_process).for_request(i, t) for i in range(per_process) for t in range(turns)}
        for rank in range(processes)
    ]  # fmt: skip
    assert all(a.isdisjoint(b) for a, b in itertools.combinations(ranks, 2))


def test_eval_keys_deal_positions_round_robin():
    # 2 processes: rank 1 plays eval positions 1, 3, 5; its env i is position 1 + 2 i
    rank1 = SeedKey(0, step=2, split="eval", first_episode=1, episode_stride=2)
    assert [rank1.for_request(i, 0) for i in range(3)] == [
        sample_seed(0, split="eval", step=2, episode=p, turn=0) for p in (1, 3, 5)
    ]


class SeedRecorder:
    """A Policy that always calls the tool once, then answers; it records each request's seed."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.seeds: dict[tuple[str, int], int | None] = {}

    def generate(self, prompts, params):
        out = []
        for prompt, seed in zip(prompts, params.request_seeds(len(prompts)), strict=True):
            text = self.tokenizer.decode(prompt)
            turn = text.count("<|im_start|>assistant") - 1
            question = text.split("What is ")[1].split(" squared")[0]
            self.seeds[(question, turn)] = seed
            reply = (
                '<tool_call>\n{"name": "square", "arguments": {"n": 2}}\n</tool_call>' if turn == 0 else "4"
            )
            ids = chat.encode(self.tokenizer, reply) + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
            out.append(Completion(ids, [0.0] * len(ids), reply, "stop"))
        return out

    def update_weights(self, model):
        """Nothing to sync."""

    def sleep(self):
        """No engine."""

    def wake_up(self):
        """No engine."""


def square(n: int) -> int:
    """Square an integer.

    Args:
        n: the number to square
    """
    return n * n


def test_lockstep_and_async_rollouts_seed_each_request_alike(tiny_tokenizer):
    tasks = [{"id": f"q{i}", "question": f"What is {i} squared?", "answer": str(i * i)} for i in range(4)]
    recorded = {}
    for name, rollout in (("lockstep", run_rollout), ("async", run_async_rollout)):
        envs = gym.make_vec("RLF/ToolUse-v0", num_envs=4, tasks=tasks, reward="exact_match",
                            python_tools=[square], autoreset_mode="Disabled")  # fmt: skip
        policy = SeedRecorder(tiny_tokenizer)
        try:
            rollout(envs, policy, [0, 1, 2, 3], group_size=1, sampling=SamplingParams(max_new_tokens=32),
                    max_total_tokens=1024, seeds=SeedKey(3, step=1, first_episode=4))  # fmt: skip
        finally:
            envs.close()
        recorded[name] = policy.seeds
    expected = {
        (str(e), t): sample_seed(3, step=1, episode=4 + e, turn=t) for e in range(4) for t in range(2)
    }
    assert recorded["lockstep"] == expected
    assert recorded["async"] == expected
