"""Both rollouts (lockstep and async) on dialogue episodes: user turns are loss-mask-0 template deltas.

The env is a real ToolUse-v0 vector env (a python tool) with a scripted user simulator; the
policy replays scripted turns with the tiny Qwen3's own logprobs. Token-exactness: each sequence
is prompt ids + generated ids (mask 1, sampler logprobs) + user/tool deltas from the chat template
(mask 0). Also: a flagged simulator turn lands in ``EpisodeStats.sim_error`` and the metrics, the
GRPO step leaves such episodes out, and a short GRPO run on RLF/CustomerService-v0 runs end to end.
"""

from __future__ import annotations

import re

import gymnasium as gym
import pytest
import torch

import rlf_envs  # noqa: F401  (registers the env ids)
from rlf_envs.dialogue import DEFAULT_STOP_MARKER
from rlf_trainer.observe.metrics import rollout_metrics
from rlf_trainer.policy import Completion, SamplingParams
from rlf_trainer.rollout import chat
from rlf_trainer.rollout.async_rollout import run_async_rollout
from rlf_trainer.rollout.lockstep import run_rollout

ROLLOUTS = {"lockstep": run_rollout, "async": run_async_rollout}
rollout_modes = pytest.mark.parametrize("mode", sorted(ROLLOUTS))

TASKS = [
    {
        "id": f"d{i}",
        "question": "Please square my number.",
        "answer": str(i * i),
        "user_instructions": f"Your number is {i}.",
    }  # fmt: skip
    for i in range(4)
]


def square(n: int) -> int:
    """Square an integer.

    Args:
        n: the number to square
    """
    return n * n


def user(request) -> str:
    """d0..d2 tell their number, then stop; d3 answers as if it were the agent (a role flip)."""
    n = int(request.instance.id[1:])
    if n == 3:
        return "How can I help you today?"
    return f"My number is {n}." if request.turn == 0 else f"Thanks. {DEFAULT_STOP_MARKER}"


def script(prompt_text: str) -> str:
    """Turn 1: ask the user; turn 2: call square(n) with the number the user gave; turn 3: answer."""
    turn = prompt_text.count("<|im_start|>assistant")
    if turn == 1:
        return "Which number?<|im_end|>"
    n = int(re.findall(r"My number is (\d+)\.", prompt_text)[-1])
    if turn == 2:
        return f'<tool_call>\n{{"name": "square", "arguments": {{"n": {n}}}}}\n</tool_call><|im_end|>'
    return f"<answer>{n * n}</answer><|im_end|>"


class ReplayPolicy:
    """A real Policy writing scripted turns; logprobs are the model's own raw log-probabilities."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.completions: list[Completion] = []

    def generate(self, prompts, params):
        out = []
        for prompt in prompts:
            ids = chat.encode(self.tokenizer, script(self.tokenizer.decode(prompt)))
            with torch.no_grad():
                logits = self.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
            logprobs = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            out.append(Completion(ids, logprobs.tolist(), self.tokenizer.decode(ids[:-1]), "stop"))
        self.completions.extend(out)
        return out


def make_envs(num_envs):
    return gym.make_vec(
        "RLF/ToolUse-v0", num_envs=num_envs, tasks=TASKS, reward="exact_match", python_tools=[square],
        user_simulator=user, max_turns=5, autoreset_mode="Disabled",
    )  # fmt: skip


@rollout_modes
def test_user_turns_are_token_exact_and_masked(mode, tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    policy = ReplayPolicy(tiny_model, tok)
    envs = make_envs(4)
    try:
        batch = ROLLOUTS[mode](envs, policy, [2, 3], group_size=2,
                               sampling=SamplingParams(max_new_tokens=64, seed=0), max_total_tokens=2048)  # fmt: skip
    finally:
        envs.close()
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    good, flagged = batch.stats[0], batch.stats[2]
    assert (good.turns, good.user_turns, good.tool_calls, good.sim_error, good.finish_reason) == (
        3, 1, 1, None, "answer")  # fmt: skip
    assert (flagged.turns, flagged.user_turns, flagged.sim_error, flagged.finish_reason) == (
        1, 0, "role_flip", "sim_error")  # fmt: skip

    transcript, tools = batch.transcripts[0], batch.tools[0]
    assert [m["role"] for m in transcript] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert transcript[3] == {"role": "user", "content": "My number is 2."}
    prompt = chat.prompt_ids(tok, transcript[:2], tools)
    gen = [chat.encode(tok, t) for t in ("Which number?<|im_end|>", script("My number is 2.<|im_start|>assistant" * 2),
                                          "<answer>4</answer><|im_end|>")]  # fmt: skip
    user_delta = chat.tool_delta_ids(tok, transcript[:3], transcript[3:4], tools)
    tool_delta = chat.tool_delta_ids(tok, transcript[:5], transcript[5:6], tools)
    assert tok.decode(user_delta).startswith("\n<|im_start|>user\nMy number is 2.<|im_end|>")
    expected = prompt + gen[0] + user_delta + gen[1] + tool_delta + gen[2]
    mask = [0] * len(prompt) + [1] * len(gen[0]) + [0] * len(user_delta) + [1] * len(gen[1]) + [0] * len(
        tool_delta) + [1] * len(gen[2])  # fmt: skip
    length = int(batch.attention_mask[0].sum())
    assert batch.input_ids[0, :length].tolist() == expected
    assert batch.loss_mask[0, :length].tolist() == mask
    assert chat.render(tok, transcript, tools, add_generation_prompt=False).startswith(tok.decode(expected))
    lp = batch.old_logprobs[0, :length]
    assert torch.count_nonzero(lp[batch.loss_mask[0, :length] == 0]) == 0 and torch.all(
        lp[torch.tensor(mask) == 1] < 0
    )
    first = next(c for c in policy.completions if c.token_ids == gen[0])
    assert torch.allclose(lp[len(prompt) : len(prompt) + len(gen[0])], torch.tensor(first.logprobs))
    assert len(batch.turn_spans[0]) == 3 and batch.turn_rewards[0] == [0.0, 0.0, 1.0]

    # the flagged episode: its one generated turn, nothing appended after it
    length = int(batch.attention_mask[2].sum())
    assert batch.loss_mask[2, :length].tolist()[-len(gen[0]) :] == [1] * len(gen[0])
    metrics = rollout_metrics(batch.stats)
    assert (
        metrics["sim_errors"] == 2.0
        and metrics["sim_errors/role_flip"] == 2.0
        and metrics["user_turns"] == 0.5
    )


def test_grpo_drops_flagged_episodes_from_the_batch(tiny_model, tiny_tokenizer):
    from rlf_trainer.algorithms.grpo import fill_batch
    from rlf_trainer.config import Config
    from rlf_trainer.rollout.collect import RolloutState

    envs = make_envs(4)
    try:
        batch = run_rollout(envs, ReplayPolicy(tiny_model, tiny_tokenizer), [2, 3], group_size=2,
                            sampling=SamplingParams(max_new_tokens=64), max_total_tokens=2048)  # fmt: skip
    finally:
        envs.close()
    config = Config()
    config.algorithm.group_size = 2

    def rollout(drop: bool) -> RolloutState:
        config.rollout.drop_sim_errors = drop
        return RolloutState(config, None, None, None)  # fill_batch without dynamic sampling plays nothing

    _, _, keep, info = fill_batch(rollout(True), 1, batch)
    assert keep == [0, 1] and info["sim_errors_dropped"] == 2.0
    _, _, keep, info = fill_batch(rollout(False), 1, batch)
    assert keep == [0, 1, 2, 3] and info["sim_errors_dropped"] == 0.0


def test_short_grpo_run_on_customer_service(tiny_model_dir, tmp_path):
    """Two GRPO steps of the tiny random model against the scripted customer, end to end on the CPU."""
    from rlf_trainer.config import load_config
    from rlf_trainer.trainer import Trainer
    from tests.helpers import TINY_CONFIG

    config = load_config(TINY_CONFIG, [f"model.path={tiny_model_dir}", "model.prepare=null",
                                       f"logging.dir={tmp_path}", "logging.progress_bar=false",
                                       "rollout.max_total_tokens=2400", "rollout.max_turns=3",
                                       "checkpoint.every=0", "eval.every=0"])  # fmt: skip
    config.env.id = "RLF/CustomerService-v0"
    config.env.kwargs = {}
    config.env.num_train_tasks = 25
    trainer = Trainer(config)
    try:
        history = trainer.train()
    finally:
        trainer.close()
    assert [r["step"] for r in history.records] == [1, 2]
    last = history.records[-1]
    assert 0.0 <= last["reward/mean"] <= 1.0 and last["turns"] >= 1 and "sim_errors_dropped" in last
    samples = (trainer.run_dir / "train_samples.jsonl").read_text().splitlines()
    assert samples and '"user_turns"' in samples[0]
