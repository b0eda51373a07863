"""HFPolicy's prefix store: a multi-turn rollout that starts from stored states samples what re-reading would."""

from __future__ import annotations

import torch

from rlf_trainer.policy import HFPolicy, SamplingParams
from rlf_trainer.policy.prefix_cache import MIN_SHARED_PREFIX, supports_prefix_cache
from rlf_trainer.rollout.chat import prompt_ids
from tests.helpers import forward_logprobs

SYSTEM = "You answer questions with the search tool. " * 6  # a long shared prefix, like tool schemas


def _first_prompts(tokenizer) -> list[list[int]]:
    questions = ["Who founded Velmora Works?", "hi", "Where is the Kestrel archive kept today?"]
    group = [q for q in questions for _ in range(2)]  # GRPO groups: each question twice
    return [
        prompt_ids(tokenizer, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
        for q in group
    ]


def _play(policy: HFPolicy, tokenizer, params: SamplingParams, turns: int = 3) -> tuple[list, int]:
    """Each turn: generate, then append the completion and a tool result of a different length per row.

    Returns every turn's completions and how many tokens turns 2+ had to compute: per row, the
    previous completion's last token (never fed to the model) and the tool result."""
    sequences = _first_prompts(tokenizer)
    history, new_tokens = [], 0
    for turn in range(turns):
        completions = policy.generate(sequences, params)
        history.append([c.token_ids for c in completions])
        for row, completion in enumerate(completions):
            result = tokenizer.encode(
                f"<tool_response>result {turn} for row {row}: " + "x " * row + "</tool_response>"
            )
            sequences[row] = sequences[row] + completion.token_ids + result
            new_tokens += (1 + len(result)) if turn + 1 < turns else 0
    return history, new_tokens


def test_the_tiny_model_qualifies(tiny_model):
    assert supports_prefix_cache(tiny_model)


def test_stored_states_give_the_same_greedy_turns_and_skip_the_rereading(tiny_model, tiny_tokenizer):
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    cached = HFPolicy(tiny_model, tiny_tokenizer)
    plain = HFPolicy(tiny_model, tiny_tokenizer, prefix_cache_tokens=0)
    assert plain.prefix_cache is None
    (turns, later_new_tokens) = _play(cached, tiny_tokenizer, params)
    assert turns == _play(plain, tiny_tokenizer, params)[0]
    # Turn 1: the six rows share the system prompt (computed once); turns 2-3 compute only new tokens.
    first = _first_prompts(tiny_tokenizer)
    shared = next(end for end in range(len(first[0])) if len({tuple(p[: end + 1]) for p in first}) > 1)
    assert shared >= MIN_SHARED_PREFIX
    first_turn_new = sum(len(p) - shared for p in first)
    assert cached.prefix_cache.prefilled_tokens == first_turn_new + later_new_tokens


def test_sampled_turns_keep_raw_logprobs(tiny_model, tiny_tokenizer):
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=5)
    sequences = _first_prompts(tiny_tokenizer)
    for _ in range(2):
        completions = policy.generate(sequences, params)
        for row, completion in enumerate(completions):
            expected = forward_logprobs(tiny_model, sequences[row], completion.token_ids)
            assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)
            sequences[row] = sequences[row] + completion.token_ids + [11, 12, 13][: row % 3 + 1]
    assert policy.prefix_cache.reused_tokens > 0


def test_a_weight_update_empties_the_store(tiny_model, tiny_tokenizer):
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    prompt = prompt_ids(tiny_tokenizer, [{"role": "user", "content": "Who founded Velmora Works?"}])
    [first] = policy.generate([prompt], params)
    follow_up = prompt + first.token_ids + [7, 8, 9]
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=1.0)
    loss = tiny_model(torch.tensor([follow_up])).logits.float().pow(2).mean()
    loss.backward()
    optimizer.step()  # in place: the stored states now belong to other weights
    reused = policy.prefix_cache.reused_tokens
    [after] = policy.generate([follow_up], params)
    assert policy.prefix_cache.reused_tokens == reused
    [fresh] = HFPolicy(tiny_model, tiny_tokenizer, prefix_cache_tokens=0).generate([follow_up], params)
    assert after.token_ids == fresh.token_ids
    assert torch.allclose(torch.tensor(after.logprobs), torch.tensor(fresh.logprobs), atol=1e-5)


def test_the_store_keeps_its_token_budget(tiny_model, tiny_tokenizer):
    policy = HFPolicy(tiny_model, tiny_tokenizer, prefix_cache_tokens=100)
    prompts = _first_prompts(tiny_tokenizer)
    policy.generate(prompts, SamplingParams(max_new_tokens=4, temperature=0.0))
    store = policy.prefix_cache
    assert 0 < store._stored_tokens <= 100  # each entry is longer than 100 / 6: most were evicted
    policy.sleep()
    assert store._stored_tokens == 0


def test_one_row_without_pads_continues_from_its_stored_turn(tiny_model, tiny_tokenizer):
    """No pad at all: generate drops the all-ones mask, and must still skip the stored columns."""
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    cached = HFPolicy(tiny_model, tiny_tokenizer)
    plain = HFPolicy(tiny_model, tiny_tokenizer, prefix_cache_tokens=0)
    sequence = _first_prompts(tiny_tokenizer)[:1][0]
    for turn in range(3):
        [a] = cached.generate([sequence], params)
        [b] = plain.generate([sequence], params)
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
        sequence = sequence + a.token_ids + tiny_tokenizer.encode(f"<tool_response>{turn}</tool_response>")
    assert cached.prefix_cache.reused_tokens > 0
