"""HFPolicy on the tiny random Qwen3: batching, stopping, raw logprobs, seeds, weight sharing."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rlf_trainer.policy import Completion, HFPolicy, Policy, SamplingParams, inference_state_dict
from rlf_trainer.policy.base import stop_ids_for
from rlf_trainer.policy.sampling import InverseCdfSampler
from tests.helpers import forward_logprobs


def test_is_a_policy(tiny_model, tiny_tokenizer):
    assert isinstance(HFPolicy(tiny_model, tiny_tokenizer), Policy)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=12, temperature=1.0, seed=3),
        SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=50, seed=3),
        SamplingParams(max_new_tokens=12, temperature=0.0),
    ],
    ids=["t1", "t0.7-top_p-top_k", "greedy"],
)
def test_logprobs_are_raw_model_logprobs_of_the_sampled_tokens(tiny_model, tiny_tokenizer, prompts, params):
    completions = HFPolicy(tiny_model, tiny_tokenizer).generate(prompts, params)
    assert len(completions) == len(prompts)
    for prompt, completion in zip(prompts, completions, strict=True):
        assert isinstance(completion, Completion)
        assert len(completion.token_ids) == len(completion.logprobs) == 12  # the random model never stops
        assert completion.finish_reason == "length"
        expected = forward_logprobs(tiny_model, prompt, completion.token_ids)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


def test_greedy_is_argmax_and_ignores_the_seed(tiny_model, tiny_tokenizer, prompts):
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    a = policy.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=1))
    b = policy.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0, seed=2))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    sequence = list(prompts[1])
    for token in a[1].token_ids:
        with torch.no_grad():
            assert token == int(tiny_model(torch.tensor([sequence])).logits[0, -1].argmax())
        sequence.append(token)


def test_seed_makes_sampling_reproducible_and_leaves_global_rng_alone(tiny_model, tiny_tokenizer, prompts):
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    rng_before = torch.get_rng_state()
    first = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=7))
    assert torch.equal(torch.get_rng_state(), rng_before)
    again = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=7))
    other = policy.generate(prompts, SamplingParams(max_new_tokens=16, seed=8))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]


def test_identical_prompts_in_a_batch_get_different_samples(tiny_model, tiny_tokenizer, prompts):
    group = HFPolicy(tiny_model, tiny_tokenizer).generate(
        [prompts[0]] * 4, SamplingParams(max_new_tokens=16, seed=0)
    )
    assert len({tuple(c.token_ids) for c in group}) == 4


def test_sampling_params_win_over_the_checkpoint_generation_config(tiny_model, tiny_tokenizer, prompts):
    # A checkpoint that ships greedy-ish defaults must not turn our sampling into greedy decoding.
    tiny_model.generation_config.do_sample = False
    tiny_model.generation_config.top_k = 1
    tiny_model.generation_config.repetition_penalty = 50.0
    tiny_model.generation_config.min_p = 0.9
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    samples = {
        tuple(policy.generate([prompts[1]], SamplingParams(max_new_tokens=8, seed=s))[0].token_ids)
        for s in range(4)
    }
    assert len(samples) == 4
    # and low temperature / top_k=1 do reach the sampler: both collapse to the greedy answer
    greedy = policy.generate([prompts[1]], SamplingParams(max_new_tokens=8, temperature=0))[0].token_ids
    top1 = policy.generate([prompts[1]], SamplingParams(max_new_tokens=8, top_k=1, seed=5))[0].token_ids
    cold = policy.generate([prompts[1]], SamplingParams(max_new_tokens=8, temperature=1e-4, seed=5))[
        0
    ].token_ids
    assert greedy == top1 == cold


@pytest.mark.parametrize("top_k, top_p", [(4, 0.95), (2, 0.99)], ids=["top_p-cuts", "top_k-cuts"])
def test_the_sampler_draws_the_warped_distribution_from_one_uniform_a_row(top_k, top_p):
    """Temperature 0.5 over logits 3, 2, 1, 0, -1, -2 gives 0.865, 0.117, 0.016, ...: top-p 0.95
    keeps the first two (top-k 4 would keep four), top-k 2 keeps them too (top-p 0.99 would keep
    three). Either way tokens 0 and 1 alone, at e^6 : e^4; a warper or the temperature ignored
    draws a third token or other shares."""
    sampler = InverseCdfSampler(temperature=0.5, top_k=top_k, top_p=top_p)
    rows = 40_000
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0]]).expand(rows, 6).clone()
    torch.manual_seed(0)
    scores = sampler(torch.zeros(rows, 1, dtype=torch.long), logits)
    assert bool((scores.isfinite().sum(dim=1) == 1).all())
    tokens = scores.argmax(dim=1)
    counts = torch.bincount(tokens, minlength=6).double() / rows
    expected = torch.tensor([1.0, math.exp(-2.0), 0, 0, 0, 0], dtype=torch.float64)
    expected /= expected.sum()
    # 40,000 draws: a frequency's standard error is at most 0.0025
    assert torch.allclose(counts, expected, atol=0.01), counts


def test_stops_at_the_first_stop_token_keeps_it_and_strips_padding(tiny_model, tiny_tokenizer, prompts):
    stop_ids = tuple(range(3, 700))  # most of the vocabulary: every row stops within a few tokens
    params = SamplingParams(max_new_tokens=40, stop_token_ids=stop_ids, seed=1)
    completions = HFPolicy(tiny_model, tiny_tokenizer).generate(prompts * 3, params)
    lengths = {len(c.token_ids) for c in completions}
    assert len(lengths) > 1, "rows of different lengths, so some were padded by generate"
    for prompt, c in zip(prompts * 3, completions, strict=True):
        assert c.finish_reason == "stop"
        assert c.token_ids[-1] in stop_ids
        assert not any(t in stop_ids for t in c.token_ids[:-1])
        assert c.text == tiny_tokenizer.decode(c.token_ids[:-1], skip_special_tokens=False)
        assert torch.allclose(
            torch.tensor(c.logprobs), forward_logprobs(tiny_model, prompt, c.token_ids), atol=1e-4
        )


def test_the_generation_configs_eos_ends_a_completion(tiny_model, tiny_tokenizer, prompts):
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    first_greedy = policy.generate([prompts[0]], SamplingParams(max_new_tokens=1, temperature=0))[
        0
    ].token_ids[0]
    tiny_model.generation_config.eos_token_id = [first_greedy]
    [c] = policy.generate([prompts[0]], SamplingParams(max_new_tokens=10, temperature=0))
    assert (c.token_ids, c.finish_reason) == ([first_greedy], "stop")
    assert c.text == ""


def test_stop_ids_combine_tokenizer_generation_config_and_params(tiny_tokenizer, tiny_model):
    ids = stop_ids_for(tiny_tokenizer, tiny_model.generation_config, SamplingParams(stop_token_ids=(42, 2)))
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tiny_tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert ids == [im_end, endoftext, 42]


def test_text_keeps_tool_call_tags(tiny_model, tiny_tokenizer):
    tag_ids = tiny_tokenizer.encode("<tool_call>", add_special_tokens=False)
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    completion = policy._completion(tag_ids + [tiny_tokenizer.eos_token_id], [0.0] * (len(tag_ids) + 1), [2])
    assert completion.text == "<tool_call>"
    assert completion.finish_reason == "stop"


def test_max_batch_size_chunks_give_the_same_greedy_results(tiny_model, tiny_tokenizer, prompts):
    params = SamplingParams(max_new_tokens=5, temperature=0)
    whole = HFPolicy(tiny_model, tiny_tokenizer).generate(prompts, params)
    chunked = HFPolicy(tiny_model, tiny_tokenizer, max_batch_size=2).generate(prompts, params)
    assert [c.token_ids for c in whole] == [c.token_ids for c in chunked]


def test_empty_batch_and_empty_prompt(tiny_model, tiny_tokenizer):
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    assert policy.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="at least one token"):
        policy.generate([[1], []], SamplingParams())


def test_invalid_sampling_params_are_rejected():
    for bad in ({"max_new_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_k": -1}):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_training_mode_is_restored_and_weights_are_shared(tiny_model, tiny_tokenizer, prompts):
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    tiny_model.train()
    params = SamplingParams(max_new_tokens=6, temperature=0)
    before = policy.generate(prompts, params)
    assert tiny_model.training
    # an "optimizer step" on the training module is seen by the next generate, with no sync
    with torch.no_grad():
        for p in tiny_model.parameters():
            p.mul_(4.0)
    policy.update_weights(tiny_model)  # same module: no-op
    after = policy.generate(prompts, params)
    assert [c.token_ids for c in before] != [c.token_ids for c in after]
    for prompt, c in zip(prompts, after, strict=True):
        assert torch.allclose(
            torch.tensor(c.logprobs), forward_logprobs(tiny_model, prompt, c.token_ids), atol=1e-4
        )


def test_update_weights_copies_from_another_module(tiny_model, tiny_tokenizer):
    trained = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(0.01)
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    policy.update_weights(trained)
    for (name, p), q in zip(tiny_model.named_parameters(), trained.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_lora_training_module_shares_or_merges(tiny_model, tiny_tokenizer, prompts):
    peft = pytest.importorskip("peft")
    inference_copy = copy.deepcopy(tiny_model)
    lora = peft.get_peft_model(
        tiny_model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():  # a trained adapter: B is zero at init
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        lora_logits = lora(ids).logits

    # the policy on the base module generates with the injected adapters: nothing to sync
    shared = HFPolicy(lora.get_base_model(), tiny_tokenizer)
    shared.update_weights(lora)

    # a separate inference module receives the merged weights
    state = inference_state_dict(lora)
    assert not any("lora_" in k or "base_layer" in k or k.startswith("base_model") for k in state)
    separate = HFPolicy(inference_copy, tiny_tokenizer)
    with torch.no_grad():
        assert not torch.allclose(inference_copy(ids).logits, lora_logits, atol=1e-4)
    separate.update_weights(lora)
    with torch.no_grad():
        assert torch.allclose(inference_copy(ids).logits, lora_logits, atol=1e-4)


def test_the_head_projects_contiguous_rows_and_never_a_whole_prompt(tiny_model, tiny_tokenizer):
    """generate's prefill projects each row's last position: a strided slice, for which torch's
    CPU linear without autograd copies the head once per row (0.96 s a call for SmolLM2 in bf16).
    The policy hands the head contiguous rows while it samples, and the prefix store's forward of
    a group's shared prompt asks for no position's logits."""
    head = tiny_model.get_output_embeddings()
    seen: list[tuple[tuple[int, ...], bool]] = []
    probe = head.register_forward_hook(
        lambda _m, args, _out: seen.append((tuple(args[0].shape), args[0].is_contiguous()))
    )
    hooks_before = len(head._forward_pre_hooks)
    policy = HFPolicy(tiny_model, tiny_tokenizer)
    group = [[5, 6, 7, 8, 9, 10]] * 3  # one prompt, three samples: the store forwards it once
    policy.generate([[1, 2, 3], [4, 5, 6, 7, 8]], SamplingParams(max_new_tokens=4, seed=0))
    policy.generate(group, SamplingParams(max_new_tokens=4, seed=0))
    probe.remove()
    assert seen and all(contiguous for _, contiguous in seen)
    assert all(shape[-2] <= 1 for shape, _ in seen if len(shape) == 3)  # never a whole prompt's logits
    assert len(head._forward_pre_hooks) == hooks_before  # the policy's hook is gone after sampling
    assert policy.prefix_cache is not None and policy.prefix_cache.prefilled_tokens > 0


def test_a_bf16_copy_is_freed_while_asleep_and_rebuilt_from_the_trained_weights(
    tiny_model, tiny_tokenizer, prompts
):
    """The sampling copy gives its memory to the update while the policy sleeps; update_weights,
    wake_up or the next generate rebuild it from the trained module, ties and all."""
    policy = HFPolicy(tiny_model, tiny_tokenizer, generation_dtype=torch.bfloat16)
    copy_ = policy.model
    tied = copy_.get_output_embeddings().weight is copy_.get_input_embeddings().weight
    params = SamplingParams(max_new_tokens=4, temperature=0)
    before = policy.generate(prompts, params)

    def matches_the_trained_weights() -> bool:
        state = copy_.state_dict()
        return all(
            torch.equal(state[name], value.to(torch.bfloat16))
            for name, value in tiny_model.state_dict().items()
        )

    policy.sleep()
    assert all(p.numel() == 0 for p in copy_.parameters())
    with torch.no_grad():  # an optimizer step on the trained module
        next(tiny_model.parameters()).add_(0.5)
    policy.update_weights(tiny_model)
    assert matches_the_trained_weights()
    policy.sleep()
    policy.wake_up()
    assert matches_the_trained_weights()
    policy.sleep()  # generate wakes a sleeping copy itself
    assert [c.token_ids for c in policy.generate(prompts, params)] == [
        c.token_ids
        for c in HFPolicy(
            copy.deepcopy(tiny_model), tiny_tokenizer, generation_dtype=torch.bfloat16
        ).generate(prompts, params)
    ]
    assert (copy_.get_output_embeddings().weight is copy_.get_input_embeddings().weight) == tied
    assert before  # the first call ran on the copy as built
    shared = HFPolicy(tiny_model, tiny_tokenizer)  # sampling with the trained module: nothing to free
    shared.sleep()
    assert all(p.numel() > 0 for p in tiny_model.parameters())
