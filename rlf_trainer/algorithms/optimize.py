"""What every update shares, SFT and GRPO alike: the state it changes and one optimizer step.

:class:`Learner` holds what an update needs (model, reference model, optimizer, LR schedule);
:func:`step_optimizer` runs ``gradient_accumulation_steps`` micro-batches through backward, clips
and steps; :func:`sync_weights` hands the new weights to a sampler that is not the trained module.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlf_trainer.algorithms.head_logprobs import chunked_selective_log_softmax
from rlf_trainer.algorithms.losses import selective_log_softmax, token_entropy
from rlf_trainer.algorithms.shared_prefix import (
    MIN_SHARED_TOKENS,
    common_prefix_length,
    first_outputs,
    forwarded_positions,
    no_logits,
    shared_prefix_hidden,
)
from rlf_trainer.config import Config
from rlf_trainer.run.bf16_rounding import autocast_matmul_parameters, round_master_weights_
from rlf_trainer.run.distributed import full_parameters


@dataclass
class Learner:
    """What an update changes: the trained model (prepared by Accelerate), the frozen reference
    model (None without a KL penalty, or under LoRA where the base with adapters off is the
    reference), the optimizer and the LR schedule."""

    config: Config
    accelerator: Any
    model: Any
    ref_model: Any | None
    optimizer: Any
    scheduler: Any


def step_optimizer(learner: Learner, micro_loss: Callable[[int], tuple[torch.Tensor, float]]) -> float | None:
    """One optimizer step over ``gradient_accumulation_steps`` micro-batches; the grad norm, if clipped.

    ``micro_loss(i)`` runs micro-batch ``i``'s forward pass and returns its loss and the step's
    denominator (the loss's normaliser counted over every micro-batch of every process, or 1.0
    when the loss is already divided by it). Accelerate divides each backward by the accumulation
    steps and DDP averages the gradients over processes; the denominator already counts both, so
    they are undone here and the gradient is exactly that of the whole step's loss.
    """
    acc, model = learner.accelerator, learner.model
    steps, max_norm = acc.gradient_accumulation_steps, learner.config.optim.max_grad_norm
    grad_norm: float | None = None
    for index in range(steps):
        with acc.accumulate(model):
            loss, denominator = micro_loss(index)
            acc.backward(loss * (steps * acc.num_processes / denominator))
            if acc.sync_gradients and max_norm > 0:
                norm_value = acc.clip_grad_norm_(model.parameters(), max_norm)
                grad_norm = float(norm_value) if norm_value is not None else None
            learner.optimizer.step()
            learner.optimizer.zero_grad(set_to_none=True)
            if acc.sync_gradients and rounds_stochastically(learner.config):
                round_master_weights_(
                    autocast_matmul_parameters(model), learner.config.seed, optimizer_steps(learner.optimizer)
                )
    if not acc.sync_gradients:
        raise RuntimeError(
            "gradient accumulation went out of step with the micro-batches: an optimizer step must "
            "be exactly gradient_accumulation_steps micro-batches"
        )
    return grad_norm


def rounds_stochastically(config: Config) -> bool:
    """``optim.stochastic_rounding`` in a run that computes in bf16 (``mixed_precision`` resolved)."""
    return config.optim.stochastic_rounding and config.mixed_precision == "bf16"


def shares_prefix(config: Config, device_type: str = "cpu") -> bool:
    """Whether the update forwards a micro-batch's common prefix once (``shared_prefix``, resolved)
    on a ``device_type`` device.

    ``auto``: on a CPU, in either precision. A GRPO group's prompt is about half of its tokens;
    the DeepSearch recipe's update of one batch (16 episodes, 2 threads) took 27-30 s in fp32 with
    whole rows, 21-23 s with a group a micro-batch and its prompt run once; in bf16 19-21 s and
    15-17 s. With 2 rows a micro-batch bf16 gained nothing (the attention over the prefix stays,
    and each call has a fixed cost): configs that share keep a group in a micro-batch
    (docs/benchmarks.md). Off on GPUs until measured there (``scripts/gpu_check.sh``).

    >>> from rlf_trainer.config import from_dict
    >>> config = from_dict({"model": {"path": "m"}})
    >>> shares_prefix(config, "cpu"), shares_prefix(config, "cuda")
    (True, False)
    """
    if config.shared_prefix != "auto":
        return bool(config.shared_prefix)
    return device_type == "cpu"


def optimizer_steps(optimizer: Any) -> int:
    """The optimizer steps taken so far, from the optimizer's own state (restored on resume): the
    ``step`` that Adam-family optimizers keep per parameter (0 for one that keeps none)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if step is not None:
                return int(step)
    return 0


@dataclass
class TokenLogprobs:
    """The log-probs ``[n, T-1]`` of the trained tokens of a batch under a model (0 elsewhere), their
    mean next-token entropy (NaN where not asked for), and the positions the model ran over (a shared prefix once, padding
    included) and the real tokens among them."""

    logp: torch.Tensor
    entropy: float
    forwarded_tokens: int
    real_tokens: int


def token_logprobs(
    accelerator: Any,
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    trained: torch.Tensor,
    *,
    share_prefix: bool = False,
    entropy: bool = True,
) -> TokenLogprobs:
    """``log pi(x_t | x_<t)`` of the tokens where ``trained`` ``[n, T-1]`` is 1, at temperature 1.

    The model runs once over the whole sequences (under the run's mixed precision) for its final
    hidden states; the vocabulary projection then runs only on the trained positions, in chunks
    (:func:`~rlf_trainer.algorithms.head_logprobs.chunked_selective_log_softmax`), never as the full
    ``[n, T, V]`` logits: prompt and tool-result positions need no logits at all. A model whose
    logits are not its output projection of the decoder's last hidden state (soft-capping,
    scaling, a custom head) takes the plain path: the full logits, then the log-softmax.
    ``share_prefix``: the rows' common prefix runs once (:func:`prefix_to_share`). ``entropy``: also
    the mean next-token entropy (else NaN; the reference and frozen passes have no use for it).
    """
    core = _core_model(accelerator, model)
    where = trained.bool()
    prefix = prefix_to_share(accelerator, model, input_ids, attention_mask) if share_prefix else 0
    forwarded, real = forwarded_positions(attention_mask, prefix)
    # the run's precision for the whole pass (a prepared model autocasts its own forward already)
    with accelerator.autocast():
        if _projects_plainly(core):
            logp, mean_entropy = _projected_logprobs(
                model, core, input_ids, attention_mask, where, prefix, entropy
            )
        else:
            mask = mask_unless_right_padded(attention_mask)
            logits = model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits[:, :-1]
            logp = selective_log_softmax(logits, input_ids[:, 1:]).masked_fill(~where, 0.0)
            rows = logits.detach()[where]
            mean_entropy = float("nan")
            if entropy:
                mean_entropy = float(token_entropy(rows).mean()) if rows.shape[0] else 0.0
    return TokenLogprobs(logp, mean_entropy, forwarded, real)


def prefix_to_share(
    accelerator: Any, model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> int:
    """How many leading tokens of a micro-batch :func:`token_logprobs` with ``share_prefix`` runs
    once for every row: the rows' common prefix when it is at least ``MIN_SHARED_TOKENS`` long, the
    batch is right-padded and the model can take it (:func:`can_share_prefix`), else 0."""
    prefix = common_prefix_length(input_ids, attention_mask)
    if prefix < MIN_SHARED_TOKENS or mask_unless_right_padded(attention_mask) is not None:
        return 0
    return prefix if can_share_prefix(accelerator, model) else 0


def can_share_prefix(accelerator: Any, model: Any) -> bool:
    """Whether ``model`` can forward a common prefix once: its logits are its head's projection,
    its parameters are whole in this process (not FSDP or DeepSpeed: untested there), it does not
    checkpoint its layers (transformers drops the cache inside a checkpointed layer), its layers
    are not compiled (``compile: true``: Dynamo would recompile each layer for its own cache
    entry) and a probe of the two passes matches one plain pass (a model without a
    ``DynamicCache`` path does not)."""
    if getattr(getattr(accelerator, "distributed_type", None), "value", "NO") in _SHARDED:
        return False
    core = _core_model(accelerator, model)
    if getattr(core, "is_gradient_checkpointing", False) or _compiled(core):
        return False
    with accelerator.autocast():  # the probes run as the update does (their answers are kept)
        if not _projects_plainly(core):
            return False
        if core not in _SHARES_PREFIX:
            _SHARES_PREFIX[core] = _probe_shared_prefix(core)
    return _SHARES_PREFIX[core]


def mask_unless_right_padded(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """``None`` when every row of ``attention_mask`` is ones then zeros (right padding), else the mask.

    A causal model's real tokens never attend to the pads after them, so a right-padded batch needs
    no mask: without one, SDPA's causal kernel skips the blocks above the diagonal, where an explicit
    mask makes it compute them all (2 x 1,250 tokens' forward and backward on SmolLM2-135M, bf16:
    3.1-3.3 s instead of 4.2-4.7). Pad positions' outputs change; nothing reads them.

    >>> mask_unless_right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]])) is None
    True
    >>> mask_unless_right_padded(torch.tensor([[0, 1, 1], [1, 1, 1]])).tolist()
    [[0, 1, 1], [1, 1, 1]]
    """
    ones = attention_mask.bool()
    # right-padded: no 1 after a 0 in any row, i.e. the mask never rises along a row
    return None if not (ones[:, 1:] & ~ones[:, :-1]).any() else attention_mask


def _projected_logprobs(
    model: Any,
    core: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    where: torch.Tensor,
    prefix: int = 0,
    entropy: bool = True,
) -> tuple[torch.Tensor, float]:
    """The decoder's last hidden states (one pass, or the shared ``prefix`` then the rows' own
    tokens), projected only where ``where`` is true."""
    # the wrapped calls (DDP) keep their gradient bookkeeping; no position's logits
    if prefix:
        hidden, out = shared_prefix_hidden(model, core.get_decoder(), input_ids, attention_mask, prefix)
    else:
        hidden, out = _decoder_hidden(model, core, input_ids, mask_unless_right_padded(attention_mask))
    picked, row_entropy = chunked_selective_log_softmax(
        hidden[:, :-1][where], core.get_output_embeddings(), input_ids[:, 1:][where], entropy=entropy
    )
    logp = torch.zeros(where.shape, dtype=torch.float32, device=picked.device)
    logp[where] = picked
    # Every parameter stays in the graph with a zero gradient, even with nothing trained (a stand-in
    # micro-batch): backward needs a graph, and DDP needs every parameter to get a gradient.
    logp = logp + 0.0 * out.logits.float().sum()
    if row_entropy is None:
        return logp, float("nan")
    return logp, float(row_entropy.mean()) if row_entropy.numel() else 0.0


def _decoder_hidden(
    model: Any, core: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
) -> tuple[torch.Tensor, Any]:
    """The decoder's last hidden states from one pass over the whole rows, and the pass's output."""
    with first_outputs(core.get_decoder()) as captured:
        none = no_logits(input_ids.device)
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=none)
    return captured[0], out


# model -> whether its logits are head(last hidden state); weak keys: a freed model's entry goes with it
_PLAIN_PROJECTION: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
# model -> whether the shared-prefix passes give its plain pass's hidden states
_SHARES_PREFIX: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_SHARDED = {"FSDP", "DEEPSPEED", "MEGATRON_LM"}


def _projects_plainly(core: Any) -> bool:
    """Whether ``core``'s logits are its output projection of its decoder's output, checked once
    per model on a short probe (a model that scales or caps its logits differs by far more than
    rounding)."""
    if core not in _PLAIN_PROJECTION:
        _PLAIN_PROJECTION[core] = _probe_projection(core)
    return _PLAIN_PROJECTION[core]


def _probe_projection(core: Any) -> bool:
    get_decoder, get_head = getattr(core, "get_decoder", None), getattr(core, "get_output_embeddings", None)
    if not (callable(get_decoder) and callable(get_head)) or get_head() is None:
        return False
    probe = torch.arange(1, 9, device=next(core.parameters()).device).unsqueeze(0)
    try:
        with torch.no_grad(), first_outputs(get_decoder()) as captured:
            logits = core(input_ids=probe, use_cache=False, logits_to_keep=1).logits[:, -1].float()
            projected = get_head()(captured[0][:, -1]).float()
            none = core(input_ids=probe, use_cache=False, logits_to_keep=no_logits(probe.device)).logits
    except (TypeError, IndexError):  # a forward without logits_to_keep, or one that takes no index
        return False
    if none.shape[1] != 0:
        return False
    # run under the caller's autocast, both sides round alike; a cap or a scale moves logits by far more
    return bool(torch.allclose(logits, projected, rtol=1e-2, atol=1e-2))


def _compiled(core: Any) -> bool:
    """Whether ``core``'s decoder layers were compiled in place (``nn.Module.compile``)."""
    layers = getattr(core.get_decoder(), "layers", None) if hasattr(core, "get_decoder") else None
    return bool(layers) and getattr(layers[0], "_compiled_call_impl", None) is not None


def _probe_shared_prefix(core: Any) -> bool:
    """Whether two rows sharing 16 of their 20 tokens get their plain pass's last hidden states
    from the shared-prefix passes, as closely as the plain pass gets them for one row alone (under
    the caller's autocast: bf16 moves SmolLM2's hidden states by ~7% between batch shapes, a cache
    the model ignores by far more)."""
    device = next(core.parameters()).device
    ids = torch.arange(1, 21, device=device).repeat(2, 1)
    ids[1, MIN_SHARED_TOKENS:] += 20
    training = core.training
    core.eval()  # dropout would tell the passes apart
    try:
        with torch.no_grad():
            plain = _decoder_hidden(core, core, ids, None)[0][1].float()
            alone = _decoder_hidden(core, core, ids[1:], None)[0][0].float()
            passes = shared_prefix_hidden(
                core, core.get_decoder(), ids, torch.ones_like(ids), MIN_SHARED_TOKENS
            )
            shared = passes[0][1].float()
    except (TypeError, ValueError, AttributeError, RuntimeError):  # no DynamicCache path
        return False
    finally:
        core.train(training)
    noise = float((alone - plain).norm())
    return float((shared - plain).norm()) <= 2 * noise + 1e-4 * float(plain.norm())


def _core_model(accelerator: Any, model: Any) -> Any:
    """The causal LM under the DDP / PEFT wrappers (its decoder and output projection)."""
    core = accelerator.unwrap_model(model)
    return core.get_base_model() if hasattr(core, "peft_config") else core


def sync_weights(learner: Learner, policy: Any, *, version: int | None = None, force: bool = False) -> None:
    """Give a sampler that is not the trained module the current weights, as version ``version``.

    A vLLM engine and the HF policy's bf16 copy: every call. Remote servers: after every
    ``policy.remote.sync_every``-th version (never when it is 0), or whenever ``force`` (a run's
    start and a resume, so the servers serve exactly the trained weights). An HF policy that
    samples with the trained module itself needs nothing.
    """
    if learner.config.policy.backend == "remote":
        every = learner.config.policy.remote.sync_every
        version = policy.version + 1 if version is None else version
        if every and (force or version % every == 0):
            push_to_servers(learner, policy, version)
    elif not samples_with_trained_model(learner, policy):
        with full_parameters(learner.accelerator, learner.model):
            policy.update_weights(learner.accelerator.unwrap_model(learner.model))


def push_to_servers(learner: Learner, policy: Any, version: int) -> None:
    """The main process writes the weights and has the servers load them; the other processes
    (whose parameters a sharded model needs to gather) then ask the servers what they serve."""
    acc = learner.accelerator
    with full_parameters(acc, learner.model):
        if acc.is_main_process:
            policy.update_weights(acc.unwrap_model(learner.model), version=version)
    acc.wait_for_everyone()
    if not acc.is_main_process:
        policy.refresh_versions()


def samples_with_trained_model(learner: Learner, policy: Any) -> bool:
    """True when the policy generates with the very module being trained (the HF backend)."""
    return getattr(policy, "model", None) is learner.accelerator.unwrap_model(learner.model)


__all__ = [
    "Learner",
    "TokenLogprobs",
    "can_share_prefix",
    "prefix_to_share",
    "shares_prefix",
    "push_to_servers",
    "samples_with_trained_model",
    "step_optimizer",
    "sync_weights",
    "token_logprobs",
]
