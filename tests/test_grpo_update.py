"""grpo.update with several optimizer steps per batch, checked against values worked out by hand.

The model is a single trainable logit vector over a 2-token vocabulary (every position predicts
``softmax(bias)``), trained by plain SGD, so each step's ratio, clip and new weights follow from a
few lines of arithmetic. Two episodes, one trained token each: episode 0 says token 0 with
advantage +0.5, episode 1 says token 1 with advantage +0.25.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from rlf_trainer.algorithms.grpo import update
from rlf_trainer.algorithms.optimize import Learner
from rlf_trainer.config import from_dict
from rlf_trainer.rollout.batch import RolloutBatch
from rlf_trainer.rollout.trajectory import EpisodeStats

ADVANTAGES = (0.5, 0.25)


class BiasOnlyLM(torch.nn.Module):
    """Logits = one trainable vector at every position."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(2))
        self.seen: list[tuple[int, ...]] = []  # input shape of every forward pass

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, use_cache: bool = False):
        self.seen.append(tuple(input_ids.shape))
        return SimpleNamespace(logits=self.bias.expand(*input_ids.shape, 2))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def run_update(
    lr: float,
    advantages: tuple[float, float] = ADVANTAGES,
    demonstrations: tuple[bool, bool] = (False, False),
    **algorithm: object,
) -> tuple[torch.Tensor, dict[str, float], BiasOnlyLM, int]:
    """The bias after ``update``, its metrics, the model (its forward shapes) and the optimizer steps.

    ``demonstrations``: which episodes are guidance demonstrations (LUFFY's shaped term)."""
    config = from_dict(
        {
            "model": {"path": "unused"},
            "algorithm": {"loss": "grpo", "group_size": 2, "normalize_std": False, **algorithm},
            "optim": {"lr": lr, "max_grad_norm": 0.0},
        }
    )
    accelerator = Accelerator(cpu=True)
    model = BiasOnlyLM()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    optimizer_steps: list[int] = []
    optimizer.register_step_post_hook(lambda *_: optimizer_steps.append(1))
    model, optimizer = accelerator.prepare(model, optimizer)
    learner = Learner(
        config=config,
        accelerator=accelerator,
        model=model,
        ref_model=None,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
    )
    batch = RolloutBatch(
        input_ids=torch.tensor([[0, 0], [0, 1]]),
        attention_mask=torch.ones(2, 2, dtype=torch.long),
        loss_mask=torch.tensor([[0, 1], [0, 1]]),
        old_logprobs=torch.full((2, 2), math.log(0.5)),
        rewards=torch.tensor([1.0, 0.5]),
        stats=[EpisodeStats(task_id=str(i), group=0, demonstration=demonstrations[i]) for i in range(2)],
        transcripts=[[], []],
        timings={},
    )
    per_token = torch.tensor([[0.0, advantages[0]], [0.0, advantages[1]]])
    metrics = update(learner, batch, per_token, keep=[0, 1])
    inner = accelerator.unwrap_model(model)
    return inner.bias.detach().clone(), metrics, inner, len(optimizer_steps)


def k3(ratio: float) -> float:
    return ratio - math.log(ratio) - 1.0


def test_two_iterations_freeze_pi_old_and_clip_on_the_second():
    a0, a1 = ADVANTAGES
    lr = 8.0
    # Pass 1: ratio 1; d logp(y)/d bias = onehot(y) - (0.5, 0.5); loss = mean over the 2 sequences.
    grad = [-(a0 * 0.5 + a1 * -0.5) / 2, -(a0 * -0.5 + a1 * 0.5) / 2]  # (-0.0625, 0.0625)
    b1 = -lr * grad[0]  # bias after pass 1 is (b1, -b1) = (0.5, -0.5)
    p0 = sigmoid(2 * b1)
    r0, r1 = p0 / 0.5, (1 - p0) / 0.5  # ratios against the frozen pi_old = 0.5
    assert r0 > 1.2 and r1 < 0.8  # episode 0 leaves the clip range on the side that stops its gradient
    # Pass 2: only episode 1 (positive advantage, ratio below 1 - eps: not clipped) has a gradient.
    grad_b0 = -a1 * r1 * (0 - p0) / 2
    b2 = b1 - lr * grad_b0

    bias, metrics, _, _ = run_update(lr, num_iterations=2)

    assert bias.tolist() == pytest.approx([b2, -b2], abs=1e-5)
    assert metrics["clip_fraction"] == pytest.approx((0.0 + 0.5) / 2, abs=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((1.0 + (r0 + r1) / 2) / 2, abs=1e-5)
    assert metrics["approx_kl_old"] == pytest.approx((0.0 + (k3(r0) + k3(r1)) / 2) / 2, abs=1e-5)


def test_a_demonstration_takes_luffys_shaped_term_and_the_policys_episode_the_ratio():
    a0, a1 = ADVANTAGES
    lr, gamma = 1.0, 0.1  # gamma: algorithm.guidance.shaping_gamma's default
    # Episode 0 is a demonstration (token 0): term -a0 f(p0), f(p) = p / (p + gamma), p0 = 0.5 at
    # bias 0; d f / d p = gamma / (p + gamma)^2 and d p0 / d bias = (0.25, -0.25).
    # Episode 1 is the policy's (token 1): term -a1 r, ratio 1; d log p1 / d bias = (-0.5, 0.5).
    grad_b0 = (-a0 * gamma / (0.5 + gamma) ** 2 * 0.25 - a1 * -0.5) / 2  # mean over the 2 sequences
    bias, _, _, _ = run_update(lr, demonstrations=(True, False))
    assert bias.tolist() == pytest.approx([-lr * grad_b0, lr * grad_b0], abs=1e-6)
    plain, _, _, _ = run_update(lr)  # the same episodes, both the policy's: another update
    assert plain.tolist() == pytest.approx(
        [-lr * (-a0 * 0.5 - a1 * -0.5) / 2, lr * (-a0 * 0.5 - a1 * -0.5) / 2]
    )


def test_two_mini_batches_are_two_optimizer_steps_on_their_own_slices():
    a0, a1 = ADVANTAGES
    lr = 2.0
    b1 = -lr * -(a0 * 0.5)  # step 1 trains on episode 0 alone (one sequence in its normaliser)
    p0 = sigmoid(2 * b1)
    r1 = (1 - p0) / 0.5  # step 2: episode 1 against pi_old frozen before step 1
    b2 = b1 - lr * -a1 * r1 * (0 - p0)

    bias, metrics, _, _ = run_update(lr, mini_batches=2)

    assert bias.tolist() == pytest.approx([b2, -b2], abs=1e-5)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["ratio_mean"] == pytest.approx((1.0 + r1) / 2, abs=1e-5)


def test_one_pass_logs_no_constant_ratio_metrics_and_takes_one_step():
    a0, a1 = ADVANTAGES
    lr = 2.0
    b1 = -lr * -(a0 * 0.5 + a1 * -0.5) / 2

    bias, metrics, _, _ = run_update(lr)

    assert bias.tolist() == pytest.approx([b1, -b1], abs=1e-6)
    assert not {"clip_fraction", "ratio_mean", "approx_kl_old", "loss"} & set(metrics)


def test_an_episode_without_advantage_is_not_forwarded_but_counts_in_the_normaliser():
    a0 = ADVANTAGES[0]
    lr = 2.0
    b1 = -lr * -(a0 * 0.5) / 2  # the same step as with episode 1 forwarded: it adds 0 over 2 sequences

    bias, metrics, model, steps = run_update(lr, advantages=(a0, 0.0))

    assert bias.tolist() == pytest.approx([b1, -b1], abs=1e-6)
    assert model.seen == [(1, 2)]  # episode 0 alone
    assert metrics["trained_share"] == 0.5
    assert steps == 1


def test_a_batch_without_signal_forwards_stand_ins_and_still_steps_the_optimizer():
    bias, metrics, model, steps = run_update(2.0, advantages=(0.0, 0.0), num_iterations=2)

    assert bias.tolist() == [0.0, 0.0]
    assert model.seen == [(1, 2), (1, 2)]  # one 2-token stand-in per optimizer step
    assert metrics["trained_share"] == 0.0
    assert steps == 2  # momentum-carrying optimizers move as they did on a zero gradient


def test_a_kl_penalty_forwards_every_episode():
    from rlf_trainer.algorithms.grpo import with_signal

    parts = SimpleNamespace(config=from_dict({"model": {"path": "unused"}, "algorithm": {"beta": 0.1}}))
    rows = np.array([0, 1])
    zero = torch.zeros(2, 3)
    assert with_signal(parts, zero, rows).tolist() == [True, True]  # type: ignore[arg-type]
    parts.config.algorithm.beta = 0.0
    assert with_signal(parts, zero, rows).tolist() == [False, False]  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------
# The update's forward on a real model: chunked projection, bf16, length-sorted micro-batches
# ------------------------------------------------------------------------------------------------


def varied_batch(vocab: int, lengths: tuple[int, ...] = (30, 9, 22, 14)) -> RolloutBatch:
    """Right-padded episodes of different lengths, the second half of each one trained."""
    generator = torch.Generator().manual_seed(0)
    width, n = max(lengths), len(lengths)
    ids = torch.zeros(n, width, dtype=torch.long)
    attention, trained = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, vocab, (length,), generator=generator)
        attention[row, :length] = 1
        trained[row, length // 2 : length] = 1
    return token_batch(ids, attention, trained, groups=[0] * n)


def token_batch(
    ids: torch.Tensor, attention: torch.Tensor, trained: torch.Tensor, groups: list[int]
) -> RolloutBatch:
    """A rollout batch of these token rows (no sampler log-probs, no rewards), row ``i`` in ``groups[i]``."""
    n, width = ids.shape
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attention,
        loss_mask=trained,
        old_logprobs=torch.zeros(n, width),
        rewards=torch.zeros(n),
        stats=[EpisodeStats(task_id=str(group), group=group) for group in groups],
        transcripts=[[] for _ in range(n)],
        timings={},
    )


def fresh_accelerator(precision: str) -> Accelerator:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # one precision per process otherwise
    return Accelerator(cpu=True, mixed_precision=precision)


def test_chunked_projection_gives_the_plain_logprobs_and_gradients(tiny_model):
    from rlf_trainer.algorithms.losses import selective_log_softmax
    from rlf_trainer.algorithms.optimize import token_logprobs

    batch = varied_batch(tiny_model.config.vocab_size)
    trained = batch.loss_mask[:, 1:]
    chunked = token_logprobs(
        fresh_accelerator("no"), tiny_model, batch.input_ids, batch.attention_mask, trained
    )
    (chunked.logp * trained).sum().backward()
    chunked_grads = {n: p.grad.clone() for n, p in tiny_model.named_parameters()}
    tiny_model.zero_grad()
    logits = tiny_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    plain = selective_log_softmax(logits, batch.input_ids[:, 1:]) * trained
    plain.sum().backward()
    assert torch.allclose(chunked.logp, plain, atol=1e-5)
    assert (chunked.logp[trained == 0] == 0).all() and (chunked.logp[trained == 1] < 0).all()
    for name, param in tiny_model.named_parameters():
        assert torch.allclose(chunked_grads[name], param.grad, atol=1e-5), name


def test_right_padded_rows_are_forwarded_without_a_mask_and_left_padded_with_it(tiny_model):
    """Right padding: no mask reaches the model (the causal kernel) and the log-probs are the masked
    forward's; a left-padded batch keeps its mask, and its log-probs too."""
    from rlf_trainer.algorithms.losses import selective_log_softmax
    from rlf_trainer.algorithms.optimize import token_logprobs

    batch = varied_batch(tiny_model.config.vocab_size)
    seen: list[object] = []  # the last call's mask is the log-probs' forward (a first call also probes)
    hook = tiny_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(kwargs.get("attention_mask")), with_kwargs=True
    )
    right = (batch.input_ids, batch.attention_mask, batch.loss_mask)
    shifts = [int((1 - m).sum()) for m in batch.attention_mask]
    left = tuple(torch.stack([row.roll(k) for row, k in zip(t, shifts, strict=True)]) for t in right)
    masks = []
    try:
        with torch.no_grad():
            for ids, mask, loss_mask in (right, left):
                got = token_logprobs(fresh_accelerator("no"), tiny_model, ids, mask, loss_mask[:, 1:]).logp
                masks.append(seen[-1])
                logits = tiny_model(input_ids=ids, attention_mask=mask).logits[:, :-1]
                want = selective_log_softmax(logits, ids[:, 1:]) * loss_mask[:, 1:]
                assert torch.allclose(got, want, atol=1e-5)
    finally:
        hook.remove()
    assert masks[0] is None and masks[1] is not None and torch.equal(masks[1], left[1])


def test_bf16_logprobs_are_within_bf16_tolerance_of_fp32(tiny_model):
    from rlf_trainer.algorithms.optimize import token_logprobs

    batch = varied_batch(tiny_model.config.vocab_size)
    trained = batch.loss_mask[:, 1:]
    args = (batch.input_ids, batch.attention_mask, trained)
    with torch.no_grad():
        fp32 = token_logprobs(fresh_accelerator("no"), tiny_model, *args).logp
        bf16 = token_logprobs(fresh_accelerator("bf16"), tiny_model, *args).logp
    gap = (bf16 - fp32)[trained == 1].abs()
    assert bf16.dtype == torch.float32  # the log-softmax is taken in fp32 from bf16 logits
    assert 0 < gap.max() < 0.05 and gap.mean() < 0.01, (gap.max(), gap.mean())


def test_length_sorted_micro_batches_give_the_one_batch_update(tiny_model_dir):
    """Two trimmed, length-sorted micro-batches and one padded batch: the same step, up to rounding."""
    from transformers import AutoModelForCausalLM

    results = []
    for accumulation in (1, 2):
        config = from_dict(
            {
                "model": {"path": "unused"},
                "algorithm": {"loss": "dapo", "group_size": 4, "num_iterations": 2},
                "optim": {"lr": 1e-2, "max_grad_norm": 0.0, "gradient_accumulation_steps": accumulation},
            }
        )
        accelerator = fresh_accelerator("no")
        accelerator.gradient_accumulation_steps = accumulation
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        model, optimizer = accelerator.prepare(model, optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        learner = Learner(config, accelerator, model, None, optimizer, scheduler)
        batch = varied_batch(model.config.vocab_size)
        advantages = torch.tensor([[1.0], [-0.5], [0.25], [-0.75]]).expand_as(batch.loss_mask).float()
        metrics = update(learner, batch, advantages * batch.loss_mask, keep=[0, 1, 2, 3])
        results.append((metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    (one, one_params), (two, two_params) = results
    assert two["update/pad_fraction"] < one["update/pad_fraction"]  # trimmed micro-batches pad less
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-6)
    for name, value in one_params.items():
        assert torch.allclose(two_params[name], value, atol=1e-6), name


# ------------------------------------------------------------------------------------------------
# A micro-batch's common prefix (a group's prompt) forwarded once
# ------------------------------------------------------------------------------------------------


def shared_prompt_batch(vocab: int, prompt: int, tails: tuple[int, ...], groups: int = 1) -> RolloutBatch:
    """``groups`` groups of ``len(tails)`` right-padded rows; a group's rows start with the same
    ``prompt`` tokens, then ``tails[i]`` of their own; training starts 3 tokens before the prompt
    ends, so some trained positions lie inside the shared prefix."""
    generator = torch.Generator().manual_seed(1)
    n, width = groups * len(tails), prompt + max(tails)
    ids = torch.zeros(n, width, dtype=torch.long)
    attention, trained = torch.zeros(n, width, dtype=torch.long), torch.zeros(n, width, dtype=torch.long)
    for group in range(groups):
        head = torch.randint(3, vocab, (prompt,), generator=generator)
        for i, tail in enumerate(tails):
            row = group * len(tails) + i
            ids[row, :prompt] = head
            ids[row, prompt : prompt + tail] = torch.randint(3, vocab, (tail,), generator=generator)
            attention[row, : prompt + tail] = 1
            trained[row, prompt - 3 : prompt + tail] = 1
    return token_batch(ids, attention, trained, groups=[row // len(tails) for row in range(n)])


def test_a_shared_prefix_forwarded_once_gives_the_plain_logprobs_and_gradients(tiny_model):
    """The prompt runs once as a [1, 20] pass, the rows' own tokens on its cached keys and values,
    the two long rows in one pass and the short one in another (one pass would pad it by 36): the
    log-probs and every gradient (different per row, so the prefix's sums several rows') are the
    whole-row pass's, and fewer positions are forwarded."""
    from rlf_trainer.algorithms.optimize import token_logprobs

    batch = shared_prompt_batch(tiny_model.config.vocab_size, prompt=20, tails=(40, 4, 36))
    trained, width = batch.loss_mask[:, 1:], batch.input_ids.shape[1]
    row_weights = torch.tensor([[1.0], [-2.0], [0.5]])
    shapes: list[tuple[int, ...]] = []
    hook = tiny_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    results = []
    try:
        for share in (False, True):
            tiny_model.zero_grad()
            out = token_logprobs(
                fresh_accelerator("no"),
                tiny_model,
                batch.input_ids,
                batch.attention_mask,
                trained,
                share_prefix=share,
            )
            (out.logp * trained * row_weights).sum().backward()
            results.append((out, {n: p.grad.clone() for n, p in tiny_model.named_parameters()}))
    finally:
        hook.remove()
    (plain, plain_grads), (shared, shared_grads) = results
    assert shapes[-3:] == [(1, 20), (2, 40), (1, 4)]  # the prefix, then the rows' own tokens
    assert torch.allclose(shared.logp, plain.logp, atol=1e-5)
    for name, grad in plain_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-5), name
    assert (plain.forwarded_tokens, plain.real_tokens) == (3 * width, 3 * 20 + 40 + 4 + 36)
    assert (shared.forwarded_tokens, shared.real_tokens) == (20 + 2 * 40 + 4, 20 + 40 + 4 + 36)


def test_bf16_shares_the_prefix_and_keeps_the_projected_path(tiny_model):
    """Under bf16 (a prepared model autocasts its forward) the first batch that asks for sharing
    must not probe the head outside autocast: that probe would fail and leave the model on the full
    ``[n, T, V]`` logits for good. Neither pass computes any position's logits."""
    from rlf_trainer.algorithms.optimize import token_logprobs

    acc = fresh_accelerator("bf16")
    with torch.no_grad():  # logits as large as a real model's: fp32 and bf16 heads differ by > 1e-2
        tiny_model.get_output_embeddings().weight.mul_(100.0)
    model = acc.prepare(tiny_model)
    batch = shared_prompt_batch(tiny_model.config.vocab_size, prompt=20, tails=(6, 3))
    kept: list[object] = []
    hook = tiny_model.register_forward_pre_hook(
        lambda _m, _a, kwargs: kept.append(kwargs.get("logits_to_keep")), with_kwargs=True
    )
    try:
        with torch.no_grad():
            out = token_logprobs(
                acc, model, batch.input_ids, batch.attention_mask, batch.loss_mask[:, 1:], share_prefix=True
            )
    finally:
        hook.remove()
    # the prefix pass and the rows' pass, both projected (the full-logits path passes no index)
    assert [tuple(k.shape) if isinstance(k, torch.Tensor) else k for k in kept[-2:]] == [(0,), (0,)]
    assert out.forwarded_tokens == 20 + 2 * 6


def test_the_prefix_is_not_shared_under_checkpointing_left_padding_or_when_short(tiny_model):
    from rlf_trainer.algorithms.optimize import prefix_to_share

    acc = fresh_accelerator("no")
    batch = shared_prompt_batch(tiny_model.config.vocab_size, prompt=20, tails=(6, 3))
    ids, mask = batch.input_ids, batch.attention_mask
    assert prefix_to_share(acc, tiny_model, ids, mask) == 20
    left_ids, left_mask = torch.stack([ids[0], ids[1].roll(3)]), torch.stack([mask[0], mask[1].roll(3)])
    assert prefix_to_share(acc, tiny_model, left_ids, left_mask) == 0
    short = shared_prompt_batch(tiny_model.config.vocab_size, prompt=15, tails=(6, 3))
    assert prefix_to_share(acc, tiny_model, short.input_ids, short.attention_mask) == 0
    tiny_model.gradient_checkpointing_enable()  # transformers drops the cache in checkpointed layers
    assert prefix_to_share(acc, tiny_model, ids, mask) == 0


def test_group_micro_batches_with_their_prompt_forwarded_once_give_the_plain_update(tiny_model_dir):
    """Two groups of two, two micro-batches: with ``shared_prefix`` each micro-batch is one group whose
    prompt runs once; the step (loss, KL, weights) is the plain one's, on 2 x 24 fewer tokens."""
    from transformers import AutoModelForCausalLM

    results = []
    for share in (False, True):
        config = from_dict(
            {
                "model": {"path": "unused"},
                "algorithm": {"loss": "grpo", "group_size": 2, "beta": 0.1},
                "optim": {"lr": 1e-2, "max_grad_norm": 0.0, "gradient_accumulation_steps": 2},
                "shared_prefix": share,
            }
        )
        accelerator = fresh_accelerator("no")
        accelerator.gradient_accumulation_steps = 2
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        ref_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        model, optimizer = accelerator.prepare(model, optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
        learner = Learner(config, accelerator, model, ref_model, optimizer, scheduler)
        batch = shared_prompt_batch(model.config.vocab_size, prompt=24, tails=(10, 4), groups=2)
        advantages = torch.tensor([[1.0], [-1.0], [0.5], [-0.5]]).expand_as(batch.loss_mask).float()
        metrics = update(learner, batch, advantages * batch.loss_mask, keep=[0, 1, 2, 3])
        results.append((metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    (plain, plain_params), (shared, shared_params) = results
    assert shared["update/tokens"] == plain["update/tokens"] - 2 * 24
    assert shared["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    assert shared["kl"] == pytest.approx(plain["kl"], abs=1e-6)
    for name, value in plain_params.items():
        assert torch.allclose(shared_params[name], value, atol=1e-6), name
