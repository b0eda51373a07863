"""Two optimizer steps of the trainer's update path on one fixed set of rollouts, split over the processes.

Run by tests/test_distributed.py, first on one process (it plays the rollouts and saves them),
then on several (each loads them and trains on its share of the groups)::

    python tests/dist_scripts/update_on_fixed_rollouts.py OUT_DIR MODEL_DIR RUN_DIR BATCH_FILE [key=value ...]

The update of a given set of episodes must not depend on how many processes share it: DDP (or
FSDP) averages the gradients, the trainer weights each process's rows by its share of the batch.
Writes ``OUT_DIR/params.pt`` (gathered parameters, main process) and ``OUT_DIR/metrics.json``
(the update and reward metrics averaged over processes, as the trainer logs them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(out_dir: str, model_dir: str, run_dir: str, batch_file: str, *overrides: str) -> None:
    import torch
    from accelerate.utils import gather_object

    from rlf_trainer.algorithms import grpo
    from rlf_trainer.algorithms.advantages import spread_over_tokens
    from rlf_trainer.observe.metrics import rollout_metrics
    from rlf_trainer.rollout.collect import collect
    from rlf_trainer.run.distributed import mean_over_processes
    from rlf_trainer.trainer import Trainer
    from tests.helpers import tiny_config

    trainer = Trainer(tiny_config(Path(model_dir), Path(run_dir), *overrides))
    acc, rollout, learner = trainer.accelerator, trainer.rollout, trainer.learner
    batch_path = Path(batch_file)
    if acc.num_processes == 1 and not batch_path.exists():
        batch = collect(rollout, step=0).batch
        torch.save(batch, batch_path)
    batch = torch.load(batch_path, weights_only=False)
    size, groups = rollout.group_size, len(batch) // rollout.group_size
    share = groups // acc.num_processes
    mine = range(acc.process_index * share * size, (acc.process_index + 1) * share * size)
    local = batch.select(list(mine))
    history = []
    for _ in range(2):
        per_turn = grpo.episode_advantages(rollout, local)
        advantages = spread_over_tokens(per_turn, local.turn_spans, local.loss_mask.shape[1])
        metrics = grpo.update(learner, local, advantages, list(range(len(local))))
        metrics = mean_over_processes(
            trainer.accelerator, {k: v for k, v in metrics.items() if k != "grad_norm"}
        )
        history.append(metrics | rollout_metrics(gather_object(list(local.stats))))  # as train_step logs them
    state = acc.get_state_dict(trainer.model)
    if acc.is_main_process:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().float().clone() for k, v in state.items()}, out / "params.pt")
        (out / "metrics.json").write_text(json.dumps({"world": acc.num_processes, "history": history}))
    trainer.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
