"""Stochastic rounding of the master weights onto bf16 values (rlf_trainer/run/bf16_rounding.py)."""

from __future__ import annotations

import pytest
import torch

from rlf_trainer.run.bf16_rounding import is_bf16_valued, round_master_weights_, stochastic_round_to_bf16_


def test_rounding_lands_on_bf16_values_and_is_unbiased():
    torch.manual_seed(0)
    values = torch.randn(64) * torch.logspace(-4, 1, 64)  # magnitudes over five decades, both signs
    draws = values.repeat(20_000, 1)
    stochastic_round_to_bf16_(draws, torch.Generator().manual_seed(1))
    assert is_bf16_valued(draws) and not is_bf16_valued(values)
    spacing = 2.0 ** (torch.floor(torch.log2(values.abs())) - 7)
    lower = values.to(torch.bfloat16).float()  # nearest; each draw is one of the two neighbours
    assert ((draws - values).abs() < spacing).all()
    assert ((draws.mean(0) - values).abs() < 0.02 * spacing).all()  # ~6 standard errors of 20k draws
    assert ((lower - values).abs() > 0.02 * spacing).any()  # nearest rounding fails that bound


def test_bf16_values_stay_and_other_dtypes_are_refused():
    exact = torch.tensor([1.0, -0.5, 3.140625, 0.0])
    kept = exact.clone()
    stochastic_round_to_bf16_(kept, torch.Generator().manual_seed(0))
    assert torch.equal(kept, exact)
    with pytest.raises(TypeError, match="fp32 master weights"):
        stochastic_round_to_bf16_(exact.to(torch.float64), torch.Generator())


def test_master_weights_round_alike_for_a_seed_and_step_and_skip_frozen_ones():
    def rounded(seed: int, step: int) -> list[torch.Tensor]:
        torch.manual_seed(0)
        layer, frozen = torch.nn.Linear(16, 16), torch.nn.Parameter(torch.randn(8), requires_grad=False)
        round_master_weights_([*layer.parameters(), frozen], seed, step)
        return [*layer.parameters(), frozen]

    first, again, other_step = rounded(3, 5), rounded(3, 5), rounded(3, 6)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # every process, a resume
    assert not all(torch.equal(a, b) for a, b in zip(first[:2], other_step[:2], strict=True))
    assert all(is_bf16_valued(p) for p in first[:2]) and not is_bf16_valued(first[2])  # frozen: untouched


def test_only_what_autocast_casts_is_rounded():
    """The linear layers' weights and biases; not the norms, the embedding or the output projection."""
    from rlf_trainer.run.bf16_rounding import autocast_matmul_parameters

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.norm = torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4)
            self.proj, self.head = torch.nn.Linear(4, 4), torch.nn.Linear(4, 10, bias=False)

        def get_output_embeddings(self) -> torch.nn.Module:
            return self.head

    model = Tiny()
    assert [id(p) for p in autocast_matmul_parameters(model)] == [id(model.proj.weight), id(model.proj.bias)]
