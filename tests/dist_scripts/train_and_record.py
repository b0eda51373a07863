"""The trainer on the tiny model, as ``rlf-train`` runs it, recording what this rank played.

Run by tests/test_distributed.py under ``torchrun``::

    python tests/dist_scripts/train_and_record.py OUT_DIR MODEL_DIR RUN_DIR [dotted.key=value ...]

Writes ``OUT_DIR/rank_<r>.json``: the world size, every ``envs.reset`` of the training rollouts
(step, split, task indices) with the per-request seeds of its first batched turn (``seeds``: the
lockstep rollout and the HF policy) and of every request (``request_seeds``: also the async rollout
on an engine with ``agenerate``, which asks one episode's turn at a time), and the logged metrics;
and ``OUT_DIR/params_rank_<r>.pt``: the trained parameters (gathered, so sharded models compare).
The recording wraps the real env and policy methods; nothing is replaced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(out_dir: str, model_dir: str, run_dir: str, *overrides: str) -> None:
    import torch

    from rlf_trainer.trainer import Trainer
    from tests.helpers import tiny_config

    trainer = Trainer(tiny_config(Path(model_dir), Path(run_dir), *overrides))
    acc = trainer.accelerator
    plays: list[dict[str, Any]] = []
    reset, generate = trainer.envs.reset, trainer.policy.generate

    def recording_reset(*args: Any, **kwargs: Any) -> Any:
        options = kwargs.get("options") or {}
        plays.append(
            {
                "step": trainer.step,
                "split": options.get("split"),
                "tasks": list(options["task_indices"]),
                "seeds": None,
                "request_seeds": [],
            }
        )
        return reset(*args, **kwargs)

    def recording_generate(prompts: Any, params: Any) -> Any:
        seeds = params.request_seeds(len(prompts))
        if plays and plays[-1]["seeds"] is None:
            plays[-1]["seeds"] = seeds
        if plays:
            plays[-1]["request_seeds"] += seeds
        return generate(prompts, params)

    agenerate = getattr(trainer.policy, "agenerate", None)

    async def recording_agenerate(prompt: Any, params: Any) -> Any:
        # an overlapped rollout runs on another thread, but never beside another reset of this rank
        plays[-1]["request_seeds"].append(params.seed)
        return await agenerate(prompt, params)

    local_steps: list[list[dict[str, Any]]] = []  # this rank's own episodes of each step (not averaged)
    train_step = trainer.train_step

    def recording_train_step() -> dict[str, float]:
        metrics = train_step()
        local_steps.append(
            [
                {
                    "task_id": s.task_id,
                    "tool_calls": s.tool_calls,
                    "tool_errors": s.tool_errors,
                    "errors": s.error_kinds,
                }
                for s in trainer.last_batch.stats
            ]
        )
        return metrics

    trainer.envs.reset = recording_reset
    trainer.policy.generate = recording_generate
    if agenerate is not None:
        trainer.policy.agenerate = recording_agenerate
    trainer.train_step = recording_train_step
    trainer.train()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "rank": acc.process_index,
        "world": acc.num_processes,
        "plays": plays,
        "local_steps": local_steps,
        "history": trainer.history.records,
    }
    (out / f"rank_{acc.process_index}.json").write_text(json.dumps(record))
    model = acc.unwrap_model(trainer.model)
    torch.save(
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        out / f"params_rank_{acc.process_index}.pt",
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
