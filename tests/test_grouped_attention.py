"""rlf_trainer.run.grouped_attention: masked grouped-query attention without repeated heads, same numbers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from rlf_trainer.policy.growing_cache import growing_cache
from rlf_trainer.run.grouped_attention import GROUPED_SDPA, use_grouped_sdpa


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every ``scaled_dot_product_attention`` call's head counts, mask and ``enable_gqa`` (the kernel still runs)."""
    calls: list[dict[str, Any]] = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, *args, **kwargs):
        calls.append({"heads": query.shape[1], "key_heads": key.shape[1], "masked": kwargs.get("attn_mask") is not None,
                      "gqa": kwargs.get("enable_gqa", False), "dtypes": {query.dtype, key.dtype, value.dtype},
                      "autocast": torch.is_autocast_enabled("cpu")})  # fmt: skip
        return kernel(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return calls


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(3, 200, (3, 13), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding: transformers then passes a mask to every attention call
    mask[2, :1] = 0
    return ids, mask


def generate(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> Any:
    config = GenerationConfig(
        max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                              past_key_values=growing_cache(model.config, ids.shape[1] + 6))  # fmt: skip


def test_masked_calls_run_grouped_heads_with_the_same_logits_and_gradients(tiny_model, kernel_calls):
    ids, mask = padded_batch()
    assert tiny_model.config.num_key_value_heads < tiny_model.config.num_attention_heads
    results = []
    for switch in (False, True):
        if switch:
            assert use_grouped_sdpa(tiny_model) and tiny_model.config._attn_implementation == GROUPED_SDPA
        tiny_model.zero_grad()
        logits = tiny_model(input_ids=ids, attention_mask=mask).logits
        logits.log_softmax(-1)[mask.bool()].max(-1).values.sum().backward()
        grads = [p.grad.clone() for p in tiny_model.parameters()]
        decoded = generate(tiny_model.eval(), ids, mask)
        tiny_model.train()
        results.append((logits.detach(), grads, decoded))
    (logits, grads, decoded), (grouped_logits, grouped_grads, grouped_decoded) = results
    assert torch.equal(grouped_logits, logits)
    for grouped, plain in zip(grouped_grads, grads, strict=True):  # the backward sums heads in another order
        torch.testing.assert_close(grouped, plain, rtol=1e-5, atol=1e-6)
    assert torch.equal(grouped_decoded.sequences, decoded.sequences)
    assert torch.equal(torch.stack(grouped_decoded.logits), torch.stack(decoded.logits))
    # before the switch every masked call repeated the key/value heads; after it none did
    half = len(kernel_calls) // 2
    assert all(c["key_heads"] == c["heads"] and not c["gqa"] for c in kernel_calls[:half] if c["masked"])
    grouped_calls = [c for c in kernel_calls[half:] if c["masked"]]
    assert grouped_calls and all(c["key_heads"] < c["heads"] and c["gqa"] for c in grouped_calls)


def test_unmasked_calls_and_other_models_are_left_to_transformers(
    tiny_model, tiny_model_dir, kernel_calls, tmp_path
):
    eager = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="eager")
    assert not use_grouped_sdpa(eager) and eager.config._attn_implementation == "eager"
    use_grouped_sdpa(tiny_model)
    ids, _ = padded_batch()
    with torch.no_grad():
        tiny_model(input_ids=ids)  # no padding: transformers' own sdpa, grouped through enable_gqa already
    assert kernel_calls and all(not c["masked"] for c in kernel_calls)
    tiny_model.save_pretrained(tmp_path)  # the name stays with the running model, not its folder
    assert '"_attn_implementation"' not in (tmp_path / "config.json").read_text()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert reloaded.config._attn_implementation == "sdpa"


def test_masked_training_calls_run_in_fp32_under_bf16(tiny_model, kernel_calls):
    """A pass that needs gradients computes masked attention in fp32 (the bf16 backward is slower
    on a CPU); passes without gradients keep bf16; the gradients stay those of the fp32 model."""
    ids, mask = padded_batch()
    use_grouped_sdpa(tiny_model)

    def grads(**autocast: Any) -> list[torch.Tensor]:
        tiny_model.zero_grad()
        with torch.autocast("cpu", **autocast):
            logits = tiny_model(input_ids=ids, attention_mask=mask).logits
        logits.float().log_softmax(-1)[mask.bool()].max(-1).values.sum().backward()
        return [p.grad.clone() for p in tiny_model.parameters()]

    full = grads(enabled=False)
    kernel_calls.clear()
    mixed = grads(dtype=torch.bfloat16)
    masked = [c for c in kernel_calls if c["masked"]]
    assert masked and all(c["dtypes"] == {torch.float32} and not c["autocast"] for c in masked)
    for low, high in zip(mixed, full, strict=True):
        torch.testing.assert_close(low, high, rtol=0.1, atol=0.02 * float(high.abs().max()))
    kernel_calls.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # sampling, the reference model
        tiny_model(input_ids=ids, attention_mask=mask)
    masked = [c for c in kernel_calls if c["masked"]]
    assert masked and all(c["autocast"] for c in masked)
    kernel_calls.clear()
    tiny_model.to(torch.bfloat16)  # bf16 weights, no autocast: fp32 kernel, bf16 output
    logits = tiny_model(input_ids=ids, attention_mask=mask).logits
    logits.float().sum().backward()
    masked = [c for c in kernel_calls if c["masked"]]
    assert logits.dtype == torch.bfloat16 and masked and all(c["dtypes"] == {torch.float32} for c in masked)
