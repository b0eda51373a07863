"""rlf_trainer.policy.growing_cache: decoding into preallocated buffers gives what transformers' cache gives."""

from __future__ import annotations

import torch
from transformers import GenerationConfig

from rlf_trainer.policy.growing_cache import GrowingLayer, growing_cache


def test_generate_samples_and_scores_as_with_transformers_cache(tiny_model):
    tiny_model.eval()
    ids = torch.randint(3, 200, (3, 17), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row
    config = GenerationConfig(
        max_new_tokens=12, do_sample=True, top_k=0, output_logits=True, return_dict_in_generate=True
    )
    outputs = []
    for cache in (None, growing_cache(tiny_model.config, ids.shape[1] + 12)):
        torch.manual_seed(3)
        with torch.no_grad():
            outputs.append(
                tiny_model.generate(
                    input_ids=ids, attention_mask=mask, past_key_values=cache, generation_config=config
                )
            )
    plain, growing = outputs
    assert torch.equal(plain.sequences, growing.sequences)
    torch.testing.assert_close(torch.stack(growing.logits), torch.stack(plain.logits), rtol=1e-5, atol=1e-5)
    layer = growing.past_key_values.layers[0]
    assert isinstance(layer, GrowingLayer) and layer.capacity == ids.shape[1] + 12  # never reallocated


def test_a_full_or_replaced_buffer_is_reallocated_with_its_contents() -> None:
    layer = GrowingLayer(capacity=2)
    steps = [torch.full((1, 1, 1, 4), float(i)) for i in range(5)]
    for step in steps[:3]:  # the third token overflows the 2 reserved: the buffer doubles
        keys, values = layer.update(step, -step)
    assert layer.capacity == 6 and keys[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0]
    layer.crop(-1)  # transformers' crop replaces the tensors with a narrower view
    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()  # e.g. a beam reorder's copy
    keys, values = layer.update(steps[3], -steps[3])
    assert keys[0, 0, :, 0].tolist() == [0.0, 1.0, 3.0]
    assert values[0, 0, :, 0].tolist() == [-0.0, -1.0, -3.0]
    keys, _ = layer.update(steps[4], -steps[4])  # in place again, in the new buffer
    assert keys.data_ptr() == layer._key_buffer.data_ptr() and keys[0, 0, :, 0].tolist() == [
        0.0,
        1.0,
        3.0,
        4.0,
    ]
