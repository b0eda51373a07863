"""The picked tokens' log-probs through the head, chunk by chunk (rlf_trainer.algorithms.head_logprobs)."""

import pytest
import torch

from rlf_trainer.algorithms.head_logprobs import chunked_selective_log_softmax


class _ScaledHead(torch.nn.Module):
    """A head that is not a plain ``nn.Linear``: it takes the checkpointed path."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.linear(rows)


@pytest.mark.parametrize("wrapped", [False, True], ids=["fused linear", "checkpointed module"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16 autocast"])
def test_logprobs_entropy_and_gradients_match_float64(wrapped, autocast):
    """Values, entropy and the gradients against a float64 log-softmax; under bf16 autocast (the
    forward runs in it, the backward after it, as in the trainer) the projection stays fp32."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 500)
    with torch.no_grad():
        linear.weight.mul_(8.0)  # logits of tens, as a trained LM head gives
    head = _ScaledHead(linear) if wrapped else linear
    hidden = torch.randn(70, 32, requires_grad=True)  # 70 rows in chunks of 16: a partial last chunk
    ids, upstream = torch.randint(0, 500, (70,)), torch.randn(70)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        # left alone, the projection would give bf16 logits (8 bits of mantissa: ~0.1 at logits of ~20)
        assert linear(hidden).dtype == (torch.bfloat16 if autocast else torch.float32)
        picked, entropy = chunked_selective_log_softmax(hidden, head, ids, chunk=16, entropy=True)
    (picked * upstream).sum().backward()
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (hidden, linear.weight, linear.bias))
    logits64 = h64 @ w64.T + b64
    exact = torch.log_softmax(logits64, -1).gather(1, ids[:, None])[:, 0]
    (exact * upstream.double()).sum().backward()
    assert picked.dtype == torch.float32 and entropy is not None and entropy.dtype == torch.float32
    assert torch.allclose(picked.double(), exact, atol=1e-4)
    log_p64 = torch.log_softmax(logits64.detach(), -1)
    assert torch.allclose(entropy.double(), -(log_p64.exp() * log_p64).sum(-1), atol=1e-4)
    for got, want in ((hidden.grad, h64.grad), (linear.weight.grad, w64.grad), (linear.bias.grad, b64.grad)):
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


def test_without_entropy_or_rows_or_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    hidden, ids = torch.randn(5, 8), torch.randint(0, 50, (5,))
    with torch.no_grad():
        picked, entropy = chunked_selective_log_softmax(hidden, head, ids, chunk=2)
        exact = torch.log_softmax(head(hidden), -1).gather(1, ids[:, None])[:, 0]
    assert entropy is None and torch.allclose(picked, exact)
    empty, no_entropy = chunked_selective_log_softmax(hidden[:0], head, ids[:0], entropy=True)
    assert empty.shape == (0,) and no_entropy is not None and no_entropy.shape == (0,)


def _double_output_with_a_torch_hook(head: torch.nn.Linear) -> None:
    head.register_forward_hook(lambda _module, _inputs, out: out * 2.0)


def _double_output_with_an_accelerate_hook(head: torch.nn.Linear) -> None:
    from accelerate.hooks import ModelHook, add_hook_to_module

    class _Double(ModelHook):
        def post_forward(self, module, output):
            return output * 2.0

    add_hook_to_module(head, _Double())


@pytest.mark.parametrize(
    "add_hook",
    [_double_output_with_a_torch_hook, _double_output_with_an_accelerate_hook],
    ids=["torch", "accelerate"],
)
def test_a_hooked_head_is_computed_through_its_hooks(add_hook):
    """A hook can change the logits (Accelerate's offload hooks move the weight in), so a hooked
    ``nn.Linear`` must not take the fused path that reads ``weight`` directly."""
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50)
    add_hook(head)
    hidden, ids = torch.randn(6, 8, requires_grad=True), torch.randint(0, 50, (6,))
    picked, _ = chunked_selective_log_softmax(hidden, head, ids, chunk=4)
    picked.sum().backward()
    grad = hidden.grad.clone()
    hidden.grad = None
    exact = torch.log_softmax(2.0 * torch.nn.functional.linear(hidden, head.weight, head.bias), -1)
    exact = exact.gather(1, ids[:, None])[:, 0]
    exact.sum().backward()
    assert torch.allclose(picked, exact, atol=1e-6) and torch.allclose(grad, hidden.grad, atol=1e-6)
