"""Both rollouts (lockstep and async) on a real ToolUse-v0 vector env (python tool) with the tiny Qwen3.

Token-exactness: every episode's sequence is prompt ids + generated ids + tool-delta ids, with loss
mask 1 exactly on the generated ids and the sampler's logprobs there. Every test runs through
``run_rollout`` (one batched generate per turn) and ``run_async_rollout`` (one coroutine per
episode; these sync policies are adapted by ``as_async_policy``, one request at a time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from collections import defaultdict

import gymnasium as gym
import pytest
import torch

import rlf_envs  # noqa: F401  (registers the env ids)
from rlf_trainer.algorithms.advantages import spread_over_tokens, turn_advantages
from rlf_trainer.policy import Completion, HFPolicy, SamplingParams
from rlf_trainer.rollout import chat
from rlf_trainer.rollout.async_rollout import run_async_rollout
from rlf_trainer.rollout.lockstep import (
    FINISH_ANSWER,
    FINISH_MAX_TOKENS,
    RolloutError,
    env_info,
    run_rollout,
    turn_end_id,
)

ROLLOUTS = {"lockstep": run_rollout, "async": run_async_rollout}
rollout_modes = pytest.mark.parametrize("mode", sorted(ROLLOUTS))

TASKS = [{"id": f"q{i}", "question": f"What is {i} squared?", "answer": str(i * i)} for i in range(6)]


def square(n: int) -> int:
    """Square an integer.

    Args:
        n: the number to square
    """
    return n * n


def make_envs(num_envs: int, **kwargs):
    return gym.make_vec(
        "RLF/ToolUse-v0",
        num_envs=num_envs,
        tasks=TASKS,
        reward="exact_match",
        python_tools=[square],
        autoreset_mode="Disabled",
        **kwargs,
    )


class ReplayPolicy:
    """A real Policy that writes scripted turns: the script picks the text from the prompt so far.

    Token ids are the tokenizer's encoding of the script text; logprobs are the model's own raw
    log-probabilities of those ids (one forward pass), exactly what a sampler would record.
    """

    def __init__(self, model, tokenizer, script):
        self.model, self.tokenizer, self.script = model, tokenizer, script
        self.calls: list[tuple[list[list[int]], list[Completion]]] = []

    def generate(self, prompts, params):
        completions = []
        for prompt in prompts:
            text = self.script(self.tokenizer.decode(prompt))
            ids = chat.encode(self.tokenizer, text)[: params.max_new_tokens]
            with torch.no_grad():
                logits = self.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            logprobs = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            stop = ids[-1] in params.stop_token_ids
            body = ids[:-1] if stop else ids
            completions.append(
                Completion(ids, logprobs.tolist(), self.tokenizer.decode(body), "stop" if stop else "length")
            )
        self.calls.append((prompts, completions))
        return completions

    def update_weights(self, model):
        """Nothing to sync: the turns are fixed."""

    def sleep(self):
        """No engine to put to sleep."""

    def wake_up(self):
        """No engine to wake."""


class RecordingPolicy(HFPolicy):
    """HFPolicy that keeps every (prompt, completion) it produced, to check the rollout against.

    Prompts of ``forced_question`` get a replayed tool call as their first turn (so sampled turns
    also follow tool results); everything else is sampled, in one batched call.
    """

    def __init__(self, model, tokenizer, forced_question: str):
        super().__init__(model, tokenizer)
        self.forced_question = forced_question
        self.replay = ReplayPolicy(model, tokenizer, tool_then_answer)
        self.record: dict[tuple[int, ...], list[Completion]] = defaultdict(list)

    def generate(self, prompts, params):
        texts = [self.tokenizer.decode(p) for p in prompts]
        forced = [self.forced_question in t and t.count("<|im_start|>assistant") == 1 for t in texts]
        seeds = params.request_seeds(len(prompts))
        sampled_params = dataclasses.replace(
            params,
            seeds=None
            if params.seeds is None
            else tuple(s for s, f in zip(seeds, forced, strict=True) if not f),
        )
        sampled = iter(
            super().generate([p for p, f in zip(prompts, forced, strict=True) if not f], sampled_params)
        )
        replayed = iter(self.replay.generate([p for p, f in zip(prompts, forced, strict=True) if f], params))
        completions = [next(replayed) if f else next(sampled) for f in forced]
        for prompt, completion in zip(prompts, completions, strict=True):
            self.record[tuple(prompt)].append(completion)
        return completions


def tool_then_answer(prompt_text: str) -> str:
    """Turn 1: call square(n); turn 2: answer n*n. For q1 answer wrongly at once."""
    n = int(re.search(r"What is (\d+) squared", prompt_text).group(1))
    if n == 1:
        return "<answer>7</answer><|im_end|>"
    if prompt_text.count("<|im_start|>assistant") == 1:
        return f'<tool_call>\n{{"name": "square", "arguments": {{"n": {n}}}}}\n</tool_call><|im_end|>'
    return f"<answer>{n * n}</answer><|im_end|>"


def segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of a 0/1 mask."""
    runs, start = [], 0
    for t in range(1, len(mask) + 1):
        if t == len(mask) or mask[t] != mask[start]:
            runs.append((mask[start], start, t))
            start = t
    return runs


@rollout_modes
def test_replayed_tool_turn_is_token_exact(mode, tiny_model, tiny_tokenizer):
    rollout = ROLLOUTS[mode]
    policy = ReplayPolicy(tiny_model, tiny_tokenizer, tool_then_answer)
    envs = make_envs(4)
    try:
        batch = rollout(
            envs,
            policy,
            [3, 1],
            group_size=2,
            sampling=SamplingParams(max_new_tokens=64, seed=0),
            max_total_tokens=1024,
        )
    finally:
        envs.close()
    tok = tiny_tokenizer
    assert [s.group for s in batch.stats] == [0, 0, 1, 1]
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    first, wrong = batch.stats[0], batch.stats[2]
    assert (first.turns, first.tool_calls, first.tool_errors, first.correct, first.answered) == (
        2,
        1,
        0,
        True,
        True,
    )
    assert (wrong.turns, wrong.tool_calls, wrong.correct, wrong.finish_reason) == (1, 0, False, FINISH_ANSWER)

    transcript, tools = batch.transcripts[0], batch.tools[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
    assert transcript[3]["content"] == "9" and tools[0]["function"]["name"] == "square"
    gen1 = chat.encode(tok, tool_then_answer("What is 3 squared?<|im_start|>assistant"))
    gen2 = chat.encode(tok, "<answer>9</answer><|im_end|>")
    prompt = chat.prompt_ids(tok, transcript[:2], tools)
    delta = chat.tool_delta_ids(tok, transcript[:3], transcript[3:4], tools)
    expected = prompt + gen1 + delta + gen2
    length = int(batch.attention_mask[0].sum())
    assert batch.input_ids[0, :length].tolist() == expected
    assert batch.loss_mask[0, :length].tolist() == [0] * len(prompt) + [1] * len(gen1) + [0] * len(delta) + [
        1
    ] * len(gen2)
    assert batch.loss_mask[0, length:].sum() == 0 and batch.attention_mask[0, length:].sum() == 0
    # the scripted turns follow the template's own format, so the sequence IS the template's rendering
    rendered = chat.render(tok, transcript, tools, add_generation_prompt=False)
    assert rendered.startswith(tok.decode(expected)) and tok.decode(expected).endswith("<|im_end|>")
    # old logprobs: the policy's, at the generated positions only
    replayed = [c for _, completions in policy.calls for c in completions]
    lp = batch.old_logprobs[0, :length]
    g1 = len(prompt)
    g2 = g1 + len(gen1) + len(delta)
    assert torch.allclose(lp[g1 : g1 + len(gen1)], torch.tensor(replayed[0].logprobs))
    assert torch.count_nonzero(lp[batch.loss_mask[0, :length] == 0]) == 0
    assert torch.all(lp[g2 : g2 + len(gen2)] < 0)
    if mode == "lockstep":  # one generate call per turn, over the still-active envs only
        assert [len(prompts) for prompts, _ in policy.calls] == [4, 2]
    else:  # one request per turn of each episode: 4 first turns, 2 second turns
        assert [len(prompts) for prompts, _ in policy.calls] == [1] * 6
        assert batch.timings["critical_path"] <= batch.timings["total"]
        assert [len(t.generate_s) for t in batch.timelines] == [2, 2, 1, 1]


@rollout_modes
def test_sampled_episodes_are_token_exact(mode, tiny_model, tiny_tokenizer):
    rollout = ROLLOUTS[mode]
    policy = RecordingPolicy(tiny_model, tiny_tokenizer, forced_question="What is 2 squared?")
    envs = make_envs(6, max_turns=3)
    try:
        batch = rollout(
            envs,
            policy,
            [0, 2, 5],
            group_size=2,
            sampling=SamplingParams(max_new_tokens=24, temperature=1.0, seed=3),
            max_total_tokens=1000,
        )
    finally:
        envs.close()
    end = turn_end_id(tiny_tokenizer)
    for row in range(len(batch)):
        length = int(batch.attention_mask[row].sum())
        ids = batch.input_ids[row, :length].tolist()
        mask = batch.loss_mask[row, :length].tolist()
        transcript, tools = batch.transcripts[row], batch.tools[row]
        runs = segments(mask)
        assert runs[0][0] == 0 and ids[: runs[0][2]] == chat.prompt_ids(tiny_tokenizer, transcript[:2], tools)
        generated = [(s, e) for v, s, e in runs if v == 1]
        assert len(generated) == batch.stats[row].turns  # every turn generated, none cut (budget is ample)
        assistant_at = [k for k, m in enumerate(transcript) if m["role"] == "assistant"]
        for turn, (s, e) in enumerate(generated):
            # the generated ids are exactly one completion the policy returned for exactly this prefix
            assert any(c.token_ids == ids[s:e] for c in policy.record[tuple(ids[:s])])
            assert torch.all(batch.old_logprobs[row, s:e] < 0)
            if turn + 1 < len(generated):  # a tool turn followed: the gap is the template's delta
                k = assistant_at[turn]
                tool_msgs = transcript[k + 1 : assistant_at[turn + 1]]
                delta = chat.tool_delta_ids(
                    tiny_tokenizer,
                    transcript[: k + 1],
                    tool_msgs,
                    tools,
                    include_end_of_turn=ids[e - 1] != end,
                )
                assert ids[e : generated[turn + 1][0]] == delta
        assert generated[-1][1] == length  # the sequence ends with the last generated token
    stats = batch.stats
    # the forced tool turns (a later sampled turn of the random model may call a tool too)
    assert all(s.tool_calls >= 1 and s.turns >= 2 for s in stats[2:4])
    assert all(s.finish_reason in ("answer", "max_turns") for s in stats)
    assert sum(s.response_length for s in stats) == int(batch.loss_mask.sum())
    phases = batch.timings["generate"] + batch.timings["tools+reward"] + batch.timings["tokenize"]
    if mode == "lockstep":  # the phases run one after another inside the rollout's wall time
        assert phases <= batch.timings["total"]
    else:  # busy seconds summed over concurrent episodes: the per-episode timelines are the figure
        assert batch.timings["generate"] == pytest.approx(sum(sum(t.generate_s) for t in batch.timelines))
        # one timed generation per turn of each episode, each episode's turns within the rollout's wall time
        assert [len(t.generate_s) for t in batch.timelines] == [s.turns for s in stats]
        assert all(t.critical_path_s <= batch.timings["total"] for t in batch.timelines)


@rollout_modes
def test_token_budget_force_finishes_episodes(mode, tiny_model, tiny_tokenizer):
    rollout = ROLLOUTS[mode]
    tok = tiny_tokenizer
    policy = ReplayPolicy(tiny_model, tok, tool_then_answer)
    envs = make_envs(2)
    try:
        _, infos = envs.reset(options={"task_indices": [3, 3]})
        prompt_len = len(chat.prompt_ids(tok, env_info(infos, 0)["messages"], env_info(infos, 0)["tools"]))
        gen1 = chat.encode(tok, tool_then_answer("What is 3 squared?<|im_start|>assistant"))
        # Room for the tool call but not for its result: the episode ends after turn 1.
        budget = prompt_len + len(gen1) + 5
        batch = rollout(
            envs,
            policy,
            [3],
            group_size=2,
            sampling=SamplingParams(max_new_tokens=64),
            max_total_tokens=budget,
        )
        assert [s.finish_reason for s in batch.stats] == [FINISH_MAX_TOKENS] * 2
        assert batch.rewards.tolist() == [0.0, 0.0]
        assert [s.turns for s in batch.stats] == [2, 2]  # the tool turn + the empty turn that ended it
        assert int(batch.attention_mask[0].sum()) == prompt_len + len(gen1)
        assert batch.transcripts[0][-1] == {"role": "assistant", "content": ""}

        # A turn longer than the budget is cut there; the env never sees the partial text.
        batch = rollout(
            envs,
            policy,
            [3],
            group_size=2,
            sampling=SamplingParams(max_new_tokens=64),
            max_total_tokens=prompt_len + 4,
        )
        assert int(batch.attention_mask[0].sum()) == prompt_len + 4 and int(batch.loss_mask[0].sum()) == 4
        assert [s.finish_reason for s in batch.stats] == [FINISH_MAX_TOKENS] * 2
        assert [s.tool_calls for s in batch.stats] == [0, 0]
    finally:
        envs.close()


@rollout_modes
def test_contract_violations_are_rollout_errors(mode, tiny_model, tiny_tokenizer):
    rollout = ROLLOUTS[mode]
    policy = ReplayPolicy(tiny_model, tiny_tokenizer, tool_then_answer)
    envs = gym.make_vec(
        "RLF/ToolUse-v0", num_envs=2, tasks=TASKS, python_tools=[square]
    )  # NextStep autoreset
    try:
        with pytest.raises(RolloutError, match="autoreset_mode='Disabled'"):
            rollout(envs, policy, [0], group_size=2, sampling=SamplingParams(), max_total_tokens=512)
    finally:
        envs.close()
    envs = make_envs(4)
    try:
        with pytest.raises(RolloutError, match="num_envs = prompts x group_size"):
            rollout(envs, policy, [0], group_size=2, sampling=SamplingParams(), max_total_tokens=512)
    finally:
        envs.close()


GATE = threading.Event()


async def gate(n: int) -> str:
    """Return at once, except for n == 3: wait (up to 10 s) until another episode starts its next turn.

    Args:
        n: the number
    """
    if n != 3:
        return "open"
    return "opened" if await asyncio.to_thread(GATE.wait, 10.0) else "still closed"


def gate_script(prompt_text: str) -> str:
    n = int(re.search(r"What is (\d+) squared", prompt_text).group(1))
    if prompt_text.count("<|im_start|>assistant") == 1:
        return f'<tool_call>\n{{"name": "gate", "arguments": {{"n": {n}}}}}\n</tool_call><|im_end|>'
    if n == 4:
        GATE.set()  # episode "4" is generating its second turn
    return f"<answer>{n * n}</answer><|im_end|>"


@rollout_modes
def test_async_episodes_do_not_wait_for_each_others_tools(mode, tiny_model, tiny_tokenizer):
    """Episode 3's tool waits for episode 4's second turn: only the async rollout lets that happen."""
    GATE.clear()
    policy = ReplayPolicy(tiny_model, tiny_tokenizer, gate_script)
    envs = gym.make_vec(
        "RLF/ToolUse-v0", num_envs=2, tasks=TASKS, reward="exact_match", python_tools=[gate],
        autoreset_mode="Disabled", tool_timeout_s=30,
    )  # fmt: skip
    try:
        batch = ROLLOUTS[mode](
            envs,
            policy,
            [3, 4],
            group_size=1,
            sampling=SamplingParams(max_new_tokens=64),
            max_total_tokens=1024,
        )
    finally:
        envs.close()
    gate_result = batch.transcripts[0][3]["content"]
    # lockstep: episode 4's second turn waits for the batch's slowest tool call, so the gate times out
    assert gate_result == ("opened" if mode == "async" else "still closed")
    assert batch.rewards.tolist() == [1.0, 1.0]


FIRST_TURNS_ASKED: dict[str, int] = defaultdict(int)


def first_asker_uses_the_tool(prompt_text: str) -> str:
    """Of two episodes of one prompt, the first to ask calls square(n) then answers; the other answers at once."""
    n = int(re.search(r"What is (\d+) squared", prompt_text).group(1))
    if prompt_text.count("<|im_start|>assistant") > 1:
        return f"<answer>{n * n}</answer><|im_end|>"
    FIRST_TURNS_ASKED[prompt_text] += 1
    if FIRST_TURNS_ASKED[prompt_text] % 2 == 1:
        return f'<tool_call>\n{{"name": "square", "arguments": {{"n": {n}}}}}\n</tool_call><|im_end|>'
    return f"<answer>{n * n}</answer><|im_end|>"


@rollout_modes
def test_a_tool_turn_reward_reaches_the_tokens_of_that_turn(mode, tiny_model, tiny_tokenizer):
    """The env's step reward of a successful tool turn (tool_success_reward) lands on that turn's ids."""
    policy = ReplayPolicy(tiny_model, tiny_tokenizer, first_asker_uses_the_tool)
    envs = make_envs(2, tool_success_reward=0.25)
    try:
        batch = ROLLOUTS[mode](
            envs, policy, [3], group_size=2, sampling=SamplingParams(max_new_tokens=64), max_total_tokens=1024
        )
    finally:
        envs.close()
    assert batch.turn_rewards == [[0.25, 1.0], [1.0]]
    assert batch.rewards.tolist() == [1.25, 1.0]  # the episode's return: the sum of its step rewards
    width = batch.loss_mask.shape[1]
    per_turn = spread_over_tokens(
        turn_advantages(batch.turn_rewards, 2, mode="per_turn_advantage", normalize_std=False),
        batch.turn_spans,
        width,
    )
    # by hand: turn 0 returns-to-go 1.25 and 1.0 (mean 1.125); turn 1 reached by one episode only
    (s0, e0), (s1, e1) = batch.turn_spans[0]
    assert torch.all(per_turn[0, s0:e0] == 0.125) and torch.all(per_turn[0, s1:e1] == 0.0)
    assert torch.all(per_turn[1][batch.loss_mask[1].bool()] == -0.125)
    assert torch.all(per_turn[batch.loss_mask == 0] == 0)
    # the spans are exactly the generated (loss mask 1) runs
    for row in range(2):
        runs = [
            (s, e)
            for v, s, e in segments(batch.loss_mask[row, : int(batch.attention_mask[row].sum())].tolist())
            if v
        ]
        assert runs == batch.turn_spans[row]
