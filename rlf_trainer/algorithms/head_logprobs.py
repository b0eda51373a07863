"""The picked tokens' log-probs through the output projection, chunk by chunk: never the ``[m, V]`` logits.

:func:`chunked_selective_log_softmax` is how the update turns the decoder's last hidden states into
``log pi(x_t | x_<t)``: with a 49k vocabulary, fp32 logits of 4 x 900 tokens are 700 MB, so the
projection runs ``chunk`` rows at a time and each chunk's logits are recomputed in the backward pass
instead of kept. For a plain ``nn.Linear`` head the forward and backward are written out by hand
(:class:`_LinearLogSoftmax`, the fused linear + log-softmax of Liger-Kernel and Cut Cross-Entropy):
autograd over a checkpointed chunk would recompute the entropy it has no gradient for, zero-fill a
``[chunk, V]`` buffer for the gather's gradient and add it to the log-sum-exp's; by hand the
backward is one projection, a softmax, one in-place pass over the chunk and two matmuls. The gradient is
the same expression autograd forms (``g * (onehot - softmax)``), so it agrees with the plain
log-softmax up to the order of the weight gradient's sums.

The projection runs in the head's own dtype even under bf16 autocast (fp32 master weights: fp32
logits) and the log-softmax in fp32: bf16 keeps 8 bits of mantissa, so a logit near 20 moves in
steps of 0.125, noise of the size of PPO's clip range in every ratio.

Example:
    >>> import torch
    >>> hidden, head = torch.randn(5, 4, requires_grad=True), torch.nn.Linear(4, 7)
    >>> ids = torch.tensor([0, 6, 3, 3, 1])
    >>> logp, _ = chunked_selective_log_softmax(hidden, head, ids, chunk=2)
    >>> plain = torch.log_softmax(head(hidden), -1).gather(1, ids[:, None])[:, 0]
    >>> torch.allclose(logp, plain)
    True
    >>> g_fused = torch.autograd.grad(logp.sum(), hidden)[0]
    >>> torch.allclose(g_fused, torch.autograd.grad(plain.sum(), hidden)[0], atol=1e-6)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


def chunked_selective_log_softmax(
    hidden: Tensor, head: Callable[[Tensor], Tensor], ids: Tensor, *, chunk: int = 512, entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """``log_softmax(head(hidden))[ids]`` for ``hidden`` ``[m, H]`` and ``ids`` ``[m]``, ``chunk`` rows
    at a time; the peak is one ``[chunk, V]`` block. ``head`` is the model's output projection; it
    runs in its weights' dtype outside any autocast. With ``entropy`` also each row's next-token
    entropy (no gradient); without it none is computed."""
    if not hidden.shape[0]:
        zeros = hidden.new_zeros(0, dtype=torch.float32)
        return zeros, (zeros.clone() if entropy else None)
    if _plain_linear(head):
        assert isinstance(head, torch.nn.Linear)
        picked, row_entropy = _LinearLogSoftmax.apply(hidden, head.weight, head.bias, ids, chunk, entropy)
        return picked, (row_entropy if entropy else None)
    return _checkpointed_chunks(hidden, head, ids, chunk, entropy)


def _plain_linear(head: Any) -> bool:
    """A head :class:`_LinearLogSoftmax` computes exactly: an ``nn.Linear`` (no hooks, Accelerate
    device hook or subclass behaviour to honour) whose weight is an ordinary tensor (not a sharded one)."""
    return (
        type(head) is torch.nn.Linear
        and not head._forward_hooks
        and not head._forward_pre_hooks
        and not hasattr(head, "_hf_hook")
        and type(head.weight.data) is torch.Tensor
    )


class _LinearLogSoftmax(torch.autograd.Function):
    """``(picked, entropy) = log_softmax(hidden @ W.T + b)[ids]`` and its entropy, chunk by chunk.

    Saves ``hidden``; the backward recomputes a chunk's logits and forms ``G = g * (onehot(ids) -
    softmax)`` in the softmax's buffer, then ``dhidden = G @ W``, ``dW += G.T @ hidden``. The
    softmax kernel, not ``exp(z - lse)``: torch's CPU ``exp`` over a ``[512, 49152]`` chunk took
    ~200 ms here against ~20 ms for the whole softmax.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor, chunk: int, entropy: bool
    ) -> tuple[Tensor, Tensor]:
        m = hidden.shape[0]
        picked = torch.empty(m, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(m, dtype=torch.float32, device=hidden.device)
        row_entropy = torch.zeros(m if entropy else 0, dtype=torch.float32, device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, m, chunk):
                end = min(start + chunk, m)
                logits = _chunk_logits(hidden[start:end], weight, bias)
                lse[start:end] = torch.logsumexp(logits, dim=-1)
                picked[start:end] = logits.gather(-1, ids[start:end, None])[:, 0] - lse[start:end]
                if entropy:  # H = lse - sum_v p_v z_v
                    probs = torch.softmax(logits, dim=-1)
                    row_entropy[start:end] = lse[start:end] - torch.linalg.vecdot(probs, logits)
        ctx.save_for_backward(hidden, weight, bias, ids)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(row_entropy)
        return picked, row_entropy

    @staticmethod
    def backward(ctx: Any, grad_picked: Tensor, _grad_entropy: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, ids = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros_like(weight) if needs_weight else None
        grad_bias = torch.zeros_like(bias) if needs_bias and bias is not None else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], ctx.chunk):
                end = min(start + ctx.chunk, hidden.shape[0])
                rows = hidden[start:end].to(weight.dtype)
                g = grad_picked[start:end, None].to(torch.float32)
                # d picked / d logits = onehot - softmax: G = g * onehot - g * softmax, in place
                grads = torch.softmax(_chunk_logits(rows, weight, bias), dim=-1).mul_(-g)
                grads.scatter_add_(1, ids[start:end, None], g)
                grads = grads.to(weight.dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = (grads @ weight).to(hidden.dtype)
                if grad_weight is not None:
                    grad_weight.addmm_(grads.T, rows)
                if grad_bias is not None:
                    grad_bias.add_(grads.sum(dim=0))
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _chunk_logits(rows: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """One chunk's logits in fp32 (the head's dtype, then widened if it is narrower)."""
    return torch.nn.functional.linear(rows.to(weight.dtype), weight, bias).float()


def _checkpointed_chunks(
    hidden: Tensor, head: Callable[[Tensor], Tensor], ids: Tensor, chunk: int, entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """Any other head: each chunk under activation checkpointing (recomputed in the backward pass)."""
    from torch.utils.checkpoint import checkpoint

    pieces, entropies = [], []
    for start in range(0, hidden.shape[0], chunk):
        rows, targets = hidden[start : start + chunk], ids[start : start + chunk]
        if torch.is_grad_enabled() and rows.requires_grad:
            picked, row_entropy = checkpoint(
                _picked_log_softmax, rows, targets, head, entropy, use_reentrant=False
            )
        else:
            picked, row_entropy = _picked_log_softmax(rows, targets, head, entropy)
        pieces.append(picked)
        entropies.append(row_entropy)
    return torch.cat(pieces), (torch.cat(entropies) if entropy else None)


def _picked_log_softmax(
    rows: Tensor, targets: Tensor, head: Callable[[Tensor], Tensor], entropy: bool
) -> tuple[Tensor, Tensor]:
    """One chunk of :func:`_checkpointed_chunks`: the targets' log-probs and (detached, from the
    same logits) each row's entropy, or an empty tensor without ``entropy``."""
    weight = getattr(head, "weight", None)
    with torch.autocast(rows.device.type, enabled=False):
        logits = head(rows.to(weight.dtype if weight is not None else torch.float32)).float()
    lse = torch.logsumexp(logits, dim=-1)
    row_entropy = logits.new_zeros(0)
    if entropy:
        with torch.no_grad():
            row_entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, row_entropy
