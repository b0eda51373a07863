"""Same seed, same run: two fresh 2-step runs play the same episodes and end with the same weights,
in lockstep and in async rollout (HF backend); another seed plays other episodes."""

from __future__ import annotations

import pytest
import torch

from rlf_trainer.trainer import Trainer
from tests.helpers import model_params, tiny_config


def two_steps(tiny_model_dir, run_root, name: str, *overrides: str):
    config = tiny_config(
        tiny_model_dir, run_root, f"logging.run_name={name}", "eval.every=0", "checkpoint.every=0",
        "checkpoint.save_final=false", "checkpoint.save_model=false", *overrides,
    )  # fmt: skip
    trainer = Trainer(config)
    history = trainer.train()
    return trainer.last_batch, history.records, model_params(trainer)


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_same_seed_gives_the_same_rollouts_and_weights(mode, tiny_model_dir, tmp_path):
    first = two_steps(tiny_model_dir, tmp_path, "a", f"rollout.mode={mode}")
    again = two_steps(tiny_model_dir, tmp_path, "b", f"rollout.mode={mode}")
    other = two_steps(tiny_model_dir, tmp_path, "c", f"rollout.mode={mode}", "seed=1")

    (batch_a, records_a, params_a), (batch_b, records_b, params_b) = first, again
    assert torch.equal(batch_a.input_ids, batch_b.input_ids) and torch.equal(
        batch_a.loss_mask, batch_b.loss_mask
    )
    for key in ("reward/mean", "grad_norm", "kl", "entropy", "response_length"):
        assert [r[key] for r in records_a] == [r[key] for r in records_b], key
    assert all(torch.equal(params_a[k], params_b[k]) for k in params_a)

    batch_c, _, params_c = other
    assert not torch.equal(
        batch_a.input_ids[:, : batch_c.input_ids.shape[1]], batch_c.input_ids[:, : batch_a.input_ids.shape[1]]
    )
    assert any(not torch.equal(params_a[k], params_c[k]) for k in params_a)
