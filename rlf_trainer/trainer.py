"""Trainer: the plumbing around a GRPO or SFT step (setup, checkpoints, logging, evaluation).

The GRPO step, rollout -> advantages -> micro-batched loss -> optimizer step -> weight sync, reads
top to bottom in :mod:`rlf_trainer.algorithms.grpo`, the SFT step in
:mod:`rlf_trainer.algorithms.sft`; :meth:`Trainer.train_step` calls one of them with the two state
objects built here once: ``rollout`` (:class:`~rlf_trainer.rollout.collect.RolloutState`: policy,
envs, prompt stream) and ``learner`` (:class:`~rlf_trainer.algorithms.optimize.Learner`: model,
reference, optimizer, LR schedule).

Everything random in a step is a function of ``(seed, step)`` (:mod:`rlf_trainer.prompts` picks the
prompts, :func:`rlf_trainer.seeds.sample_seed` seeds every request),
so resuming from a checkpoint reproduces the steps of an uninterrupted run.

Example:
    >>> from rlf_trainer.config import load_config
    >>> trainer = Trainer(load_config("examples/configs/tiny_test.yaml"))  # doctest: +SKIP
    >>> history = trainer.train()  # a run of minutes: tests/test_trainer.py runs it  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelerate.utils import gather_object

from rlf_trainer import build
from rlf_trainer.algorithms import grpo
from rlf_trainer.algorithms.optimize import sync_weights
from rlf_trainer.algorithms.sft import sft_step
from rlf_trainer.algorithms.sft_data import load_sft_examples
from rlf_trainer.config import Config, ConfigError, dump_config
from rlf_trainer.observe import trackers
from rlf_trainer.observe.budget import check_run_budget
from rlf_trainer.observe.evaluation import evaluate
from rlf_trainer.observe.health import HealthLog, HealthMonitor
from rlf_trainer.observe.metrics import (
    MetricsHistory,
    append_jsonl,
    drop_records_after,
    plot_learning_curve,
    rollout_metrics,
    sample_records,
)
from rlf_trainer.observe.progress import flat_hparams, step_printer
from rlf_trainer.policy.base import Policy, inference_state_dict
from rlf_trainer.prompts import PromptSampler
from rlf_trainer.rollout.batch import RolloutBatch
from rlf_trainer.rollout.collect import Prefetch, RolloutState, episodes_per_process, rolls_ahead
from rlf_trainer.run import checkpoint as ckpt
from rlf_trainer.run import distributed
from rlf_trainer.run.compile import check_compiler, compile_decoder_layers
from rlf_trainer.run.distributed import full_parameters
from rlf_trainer.run.precision import emulated_bf16_warning, resolve_mixed_precision

if TYPE_CHECKING:
    from accelerate import Accelerator

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------------


def eval_due(step: int, every: int, max_steps: int) -> bool:
    """Whether step ``step`` ends with an evaluation: every ``every`` steps and after the last one
    (so a run whose length is not a multiple still reports its final model); ``every=0`` never.

    Example:
        >>> [s for s in range(1, 8) if eval_due(s, every=3, max_steps=7)]
        [3, 6, 7]
    """
    return every > 0 and (step % every == 0 or step == max_steps)


class Trainer:
    """Builds everything a run needs from a :class:`~rlf_trainer.config.Config`; :meth:`train` runs it.

    Attributes worth reading after a step: ``step`` (optimizer steps done), ``history``
    (:class:`~rlf_trainer.observe.metrics.MetricsHistory`), ``last_batch`` (the last training
    :class:`~rlf_trainer.rollout.lockstep.RolloutBatch`), ``run_dir``.
    """

    def __init__(self, config: Config) -> None:
        from accelerate.utils import set_seed

        self.config = config.validate()
        # `auto` becomes what this machine does fast; config.yaml records the choice
        config.mixed_precision = resolve_mixed_precision(config.mixed_precision)
        if config.compile:
            check_compiler()  # before any process or model starts
        self.run_dir = config.run_dir
        resume_from = ckpt.resolve_resume(config.checkpoint.resume, config.checkpoint_dir)
        self.accelerator = acc = self._start_accelerator(resume_from)
        set_seed(config.seed)
        slow_precision = emulated_bf16_warning(config.mixed_precision, acc.device.type)
        if slow_precision and acc.is_main_process:
            logger.warning("%s", slow_precision)
        if acc.is_main_process:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            dump_config(config, self.run_dir / "config.yaml")

        self.model_path = build.prepared_model_path(config, acc)
        self.tokenizer = build.load_tokenizer(config, self.model_path)
        self.learner = build.learner(config, acc, self.model_path)
        self.model = self.learner.model

        self.step = 0
        self.history = MetricsHistory()
        self.last_batch: RolloutBatch | None = None
        self._last_saved_step: int | None = None
        self._last_eval_step: int | None = None
        self.envs = build.make_envs(config, episodes_per_process(config, acc.num_processes))
        try:  # the envs run tool-server processes: never leave them behind on a failed start
            self._build_rollout(resume_from)
        except BaseException:
            if hasattr(self, "policy"):
                self.policy.close()
            self.envs.close()
            raise

    def _start_accelerator(self, resume_from: Path | None) -> Accelerator:
        """The run's Accelerator, its trackers checked first: a tracker that is misspelt or not
        installed stops the run before anything is built."""
        config = self.config
        log_with = trackers.trackers(
            config.logging,
            self.run_dir,
            first_step=ckpt.read_state(resume_from)["step"] if resume_from else 0,
        )
        return distributed.make_accelerator(
            config.distributed.timeout_s,
            gradient_accumulation_steps=config.optim.gradient_accumulation_steps,
            mixed_precision=config.mixed_precision,
            log_with=log_with or None,
            project_dir=str(self.run_dir),
        )

    def _build_rollout(self, resume_from: Path | None) -> None:
        """Budget, health, policy, demonstrator and rollout state over the started envs; then the
        resume and the first weight sync."""
        config, acc = self.config, self.accelerator
        # before step 1 (and before a vLLM engine starts): a prompt over the budget is an error
        self.budget = check_run_budget(config, self.envs, self.tokenizer, acc.unwrap_model(self.model).config)
        self.health = HealthMonitor(config.health, max_total_tokens=config.rollout.max_total_tokens,
                                    tool_schema_tokens=self.budget.tool_schema_tokens)  # fmt: skip
        self.health_log = HealthLog(self.run_dir if acc.is_main_process else None, config.health.fail_on)
        sampler = PromptSampler(build.num_train_tasks(config, self.envs), config.seed)
        self.policy: Policy = build.make_policy(config, acc, self.model, self.tokenizer, self.model_path)
        if config.compile:  # after the policy: the HF policy's bf16 copy must be a plain module
            for model in (acc.unwrap_model(self.model), self.learner.ref_model):
                if model is not None:
                    compile_decoder_layers(model)
        demonstrator = build.make_demonstrator(config)  # algorithm.guidance (None when it is off)
        self.rollout = RolloutState(config, acc, self.policy, self.envs, sampler, demonstrator=demonstrator)
        self.prefetch = Prefetch() if rolls_ahead(config) else None
        self.sft_data, self.sft_sampler = self._load_sft_data()
        self._resume(resume_from)
        # Versions count optimizer steps. A separate sampler gets the weights it must start from:
        # after a resume always; remote servers at a fresh start too (they may serve another copy,
        # dtype or run's weights).
        self.rollout.weights_version = self.step
        if self.step or config.policy.backend == "remote":
            sync_weights(self.learner, self.policy, version=self.step, force=True)
        acc.init_trackers(
            config.logging.project,
            config=flat_hparams(config.to_dict()),
            init_kwargs=trackers.init_kwargs(config.logging, self.run_dir),
        )

    def _load_sft_data(self) -> tuple[Any, PromptSampler | None]:
        """``algorithm.name: sft``: the demonstrations as token ids and masks, and their epoch-wise stream."""
        cfg = self.config
        if cfg.algorithm.name != "sft":
            return None, None
        if cfg.sft.batch_size % self.accelerator.num_processes:
            raise ConfigError(
                f"sft.batch_size={cfg.sft.batch_size} must be a multiple of the {self.accelerator.num_processes} processes"
            )
        data = load_sft_examples(cfg.sft.data, self.tokenizer, max_total_tokens=cfg.rollout.max_total_tokens)
        return data, PromptSampler(len(data.examples), cfg.seed)

    def _data_state(self, step: int) -> dict[str, Any]:
        """Where the run's data stream stands after ``step`` steps (the prompts, or the SFT examples)."""
        if self.sft_sampler is not None:
            return self.sft_sampler.state(step, self.config.sft.batch_size)
        return self.rollout.sampler.state(step, self.config.rollout.prompts_per_step)

    def _resume(self, path: Path | None) -> None:
        if path is None:
            return
        state = ckpt.read_state(path)
        expected = self._data_state(state["step"])
        if state.get("sampler") != expected:
            logger.warning(
                "resuming from %s with a different prompt stream (%s != %s): steps will differ from the original run",
                path,
                state.get("sampler"),
                expected,
            )
        note = distributed.resume_note(state.get("num_processes"), self.accelerator.num_processes)
        if note and self.accelerator.is_main_process:
            logger.warning("%s", note)
        self.accelerator.load_state(str(path))
        self.step = int(state["step"])
        self.history = MetricsHistory(state.get("history", []))
        self.health.replay(self.history.records)
        self._last_saved_step = self.step
        self._last_eval_step = state.get("last_eval_step")
        if self.accelerator.is_main_process:
            for name in ("train_samples.jsonl", "eval_samples.jsonl"):
                drop_records_after(self.run_dir / name, self.step)
            logger.warning("resumed from %s at step %d", path, self.step)

    # ------------------------------------------------------------------------------ training
    def train(self) -> MetricsHistory:
        """Run until ``max_steps``: steps, evals, checkpoints; then the final checkpoint, curve and metrics."""
        cfg = self.config
        try:
            stage = "SFT" if cfg.algorithm.name == "sft" else "GRPO"
            printing = cfg.logging.progress_bar and self.accelerator.is_main_process
            with step_printer(
                stage, cfg.max_steps, self.step, lambda: self.step, enabled=printing
            ) as advance:
                while self.step < cfg.max_steps:
                    metrics = self.train_step()
                    if eval_due(self.step, cfg.eval.every, cfg.max_steps):
                        metrics.update(self.evaluate())
                    self._log(metrics)
                    advance(metrics)
                    if cfg.checkpoint.every and self.step % cfg.checkpoint.every == 0:
                        self.save_checkpoint()
            if cfg.checkpoint.save_final and self._last_saved_step != self.step:
                self.save_checkpoint()
            if cfg.checkpoint.save_model:
                self.save_model()
            self._write_run_files()
        except BaseException as exc:  # tell the other ranks before close() tears the process group down
            raise distributed.explain_failure(self.accelerator, exc)  # noqa: B904 (exc itself, or a RankFailure chained to it)
        finally:
            self.close()
        return self.history

    def train_step(self) -> dict[str, float]:
        """One GRPO step (:func:`rlf_trainer.algorithms.grpo.train_step`); returns its metrics (mean over processes)."""
        cfg = self.config
        next_step = self.step + 1
        # Overlap never reaches across an eval or a checkpoint: the step after one samples
        # on-policy, exactly as a run resumed from that checkpoint does.
        prefetch_next = (
            self.prefetch is not None
            and next_step < cfg.max_steps
            and not eval_due(next_step, cfg.eval.every, cfg.max_steps)
            and not (cfg.checkpoint.every and next_step % cfg.checkpoint.every == 0)
        )
        if self.sft_data is not None:
            metrics = sft_step(self.learner, self.policy, self.sft_data, self.sft_sampler, self.step)
            self.step = next_step
            return distributed.mean_over_processes(self.accelerator, metrics)
        batch, metrics = grpo.train_step(
            self.rollout, self.learner, self.step, self.prefetch, prefetch_next=prefetch_next
        )
        self.step = next_step
        self.last_batch = batch
        metrics = distributed.mean_over_processes(self.accelerator, metrics)
        # std and fractions over every process's episodes, not a mean of the processes' values
        if self.accelerator.num_processes > 1:
            metrics |= rollout_metrics(grpo.own_episodes(gather_object(list(batch.stats))))
        if cfg.logging.samples_jsonl and cfg.logging.samples_per_step and self.accelerator.is_main_process:
            append_jsonl(
                self.run_dir / "train_samples.jsonl",
                sample_records(
                    batch.stats,
                    batch.transcripts,
                    step=self.step,
                    limit=cfg.logging.samples_per_step,
                    kind="train",
                ),
            )
        return metrics

    def evaluate(self) -> dict[str, float]:
        """``eval.num_prompts`` test prompts, one sample each (:func:`rlf_trainer.observe.evaluation.evaluate`)."""
        self._last_eval_step = self.step
        return evaluate(self.rollout, self.step, self.run_dir / "eval_samples.jsonl")

    # ------------------------------------------------------------------------------ bookkeeping
    def save_checkpoint(self) -> Path:
        """``accelerator.save_state`` + ``trainer_state.json`` into ``<checkpoint dir>/step_<k>``."""
        cfg, acc = self.config, self.accelerator
        path = ckpt.checkpoint_path(cfg.checkpoint_dir, self.step)
        acc.wait_for_everyone()
        acc.save_state(str(path))
        if acc.is_main_process:
            ckpt.write_state(
                path,
                {
                    "step": self.step,
                    "num_processes": acc.num_processes,
                    "sampler": self._data_state(self.step),
                    "rng": {
                        "seed": cfg.seed,
                        "sampling_seeds": "rlf_trainer.seeds.sample_seed(seed, step=..., episode=..., turn=...)",
                        "process_states": "random_states_<rank>.pkl (python, numpy, torch; saved by Accelerate)",
                    },
                    "last_eval_step": self._last_eval_step,
                    "history": self.history.records,
                },
            )
            ckpt.prune_checkpoints(cfg.checkpoint_dir, cfg.checkpoint.keep_last)
        acc.wait_for_everyone()
        self._last_saved_step = self.step
        return path

    def save_model(self, path: str | os.PathLike[str] | None = None) -> Path:
        """The current policy as a Hugging Face model folder (default ``config.model_dir``, ``<run dir>/model``).

        Config, safetensors, generation config and tokenizer; LoRA adapters are merged into the
        weights and sharded (ZeRO-3/FSDP) parameters gathered first, so the folder loads like the
        base model did. Call it on every process; the main process writes.

        Example:
            >>> trainer.save_model()                                      # doctest: +SKIP
            >>> AutoModelForCausalLM.from_pretrained(trainer.config.model_dir)  # doctest: +SKIP
        """
        out = Path(path) if path is not None else self.config.model_dir
        acc = self.accelerator
        acc.wait_for_everyone()
        with full_parameters(acc, self.model):
            if acc.is_main_process:
                model = acc.unwrap_model(self.model)
                weights = {name: t.detach().contiguous() for name, t in inference_state_dict(model).items()}
                plain = model.get_base_model() if hasattr(model, "peft_config") else model
                plain.save_pretrained(out, state_dict=weights)
                self.tokenizer.save_pretrained(out)
        acc.wait_for_everyone()
        return out

    def _log(self, metrics: dict[str, float]) -> None:
        health = self.health.update(self.step, metrics)
        metrics = metrics | health.flags
        self.history.add(self.step, metrics)
        self.accelerator.log(metrics, step=self.step)
        if self.accelerator.is_main_process:
            self.history.write_jsonl(self.run_dir / "metrics.jsonl")
            self.health_log.write(health)
        self.health_log.raise_on_failure(health)  # every process: they stop together

    def _write_run_files(self) -> None:
        if not self.accelerator.is_main_process:
            return
        self.history.write_jsonl(self.run_dir / "metrics.jsonl")
        plot_learning_curve(
            self.history, self.run_dir / "learning_curve.png", title=self.config.logging.run_name
        )

    def close(self) -> None:
        """Shut the policy down, end the trackers (flushes TensorBoard), close the envs (stops their tool servers)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if getattr(self, "prefetch", None) is not None:
            self.prefetch.close()
        self.policy.close()  # first: a vLLM engine needs the process group that end_training destroys
        distributed.stop_rank_watch(self.accelerator)
        self.accelerator.end_training()
        self.envs.close()
