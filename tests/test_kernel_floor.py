"""``rlf-bench floor``: the kernel recorder, the replay of what it recorded, and the report."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from rlf_bench.cli import main
from rlf_bench.kernel_floor import KernelRecorder, TensorLayout


def test_recorder_counts_each_linear_and_attention_call_of_a_forward(tiny_model):
    """A Llama forward runs 7 matmuls per layer plus the head's, and one attention kernel per layer;
    the recorded layouts replay into operands of the same shapes, strides and results' shapes."""
    layers = tiny_model.config.num_hidden_layers
    recorder = KernelRecorder()
    ids = torch.randint(0, tiny_model.config.vocab_size, (2, 12))
    with torch.no_grad(), recorder:
        tiny_model(ids)
    by_op: dict[str, int] = {}
    for call, count in recorder.calls.items():
        by_op[call.op.overloadpacket.__name__] = by_op.get(call.op.overloadpacket.__name__, 0) + count
    assert by_op.pop("_scaled_dot_product_flash_attention_for_cpu") == layers
    assert sum(by_op.values()) == 7 * layers + 1  # q, k, v, o, gate, up, down; the vocabulary head
    for call in recorder.calls:
        with torch.no_grad():
            out = call.prepare(torch.bfloat16)()
        first = out[0] if isinstance(out, tuple) else out
        operand = next(a for a in call.args if isinstance(a, TensorLayout))
        assert first.dtype == torch.bfloat16 and first.dim() == len(operand.shape)


def test_layout_keeps_strides_of_a_transposed_operand():
    weight = torch.randn(6, 4).t()
    layout = TensorLayout(tuple(weight.shape), tuple(weight.stride()), weight.dtype)
    made = layout.materialise(torch.bfloat16)
    assert made.shape == weight.shape and made.stride() == weight.stride() and made.dtype == torch.bfloat16
    mask = TensorLayout((2, 3), (3, 1), torch.bool).materialise(torch.bfloat16)
    assert mask.dtype == torch.bool and bool(mask.all())  # only floating operands change dtype


def test_floor_report_on_the_tiny_config(capfd, tiny_model_dir):
    """The timed and the recorded fp32 runs play the same episodes; each phase's bound is its wall
    over its bf16 floor, and the update's share of the peak is reported."""
    from tests.helpers import TINY_CONFIG

    overrides = [f"model.path={tiny_model_dir}", "model.prepare=null",
                 f"env.kwargs.mcp_servers.mcpServers.latency.command={sys.executable}"]  # fmt: skip
    assert main(["floor", "--config", str(TINY_CONFIG), "--steps", "2", "--json", *overrides]) == 0
    out = capfd.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert report["same_episodes"] is True
    assert set(report["phases"]) == {"generation", "update"}
    for phase in report["phases"].values():
        assert phase["calls"] > 0 and phase["kernels_s"] > 0
        assert phase["speedup_bound"] == pytest.approx(phase["wall_s"] / phase["bf16_floor_s"])
    assert report["update_peak_share_bound"] > 0
    assert report["precision"] == "no" and "it can be at most" in "\n".join(out)
    with pytest.raises(SystemExit):
        main(["floor", "--config", str(TINY_CONFIG), "--steps", "1"])
    assert "--steps must be >= 2" in capfd.readouterr().err
