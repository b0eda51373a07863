"""The trainer's configuration: pydantic models, loadable from YAML, overridable from the CLI.

Every field has a default, so a YAML file only names what it changes. ``load_config`` reads a file,
applies dotted ``key=value`` overrides (values parsed by YAML rules: ``3`` is an int, ``1e-6`` a
float, ``true`` a bool, ``[a, b]`` a list, ``null`` None) and checks every key, type and range
(the sections are in :mod:`rlf_trainer.config_sections`). Whatever is wrong is a
:class:`ConfigError` that names the dotted key; an unknown key also gets a did-you-mean and the
valid keys at its level.

Example:
    >>> cfg = load_config(None, ["model.path=Qwen/Qwen3-4B", "optim.lr=1e-5", "env.kwargs.max_turns=3"])
    >>> cfg.optim.lr, cfg.algorithm.loss, cfg.env.kwargs
    (1e-05, 'grpo', {'max_turns': 3})
    >>> load_config(None, ["optim.lrr=1"])
    Traceback (most recent call last):
    ...
    rlf_trainer.config.ConfigError: unknown key 'optim.lrr' (did you mean 'optim.lr'?); valid keys in 'optim': adam_beta1, adam_beta2, adam_eps, gradient_accumulation_steps, lr, max_grad_norm, min_lr_ratio, schedule, stochastic_rounding, warmup_steps, weight_decay
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field, ValidationError

from rlf_trainer.config_errors import describe_errors
from rlf_trainer.config_sections import (
    AlgorithmConfig,
    CheckpointConfig,
    DistributedConfig,
    EnvConfig,
    EvalConfig,
    GuidanceConfig,
    HealthConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    PolicyConfig,
    RolloutConfig,
    Section,
    SFTConfig,
)
from rlf_trainer.names import clip_range


def _yaml_no(value: Any) -> Any:
    """YAML 1.1 reads Accelerate's spelling ``mixed_precision=no`` as ``false``: take it as ``no``."""
    return "no" if value is False else value


class ConfigError(ValueError):
    """A config file or override names an unknown key, has a wrong type or an inconsistent value."""


def check_guidance(guidance: GuidanceConfig, algorithm: AlgorithmConfig) -> None:
    """The rules of ``algorithm.guidance`` that tie its keys together (nothing to check when it is off).

    Example:
        >>> check_guidance(GuidanceConfig(enabled=True), AlgorithmConfig())
        Traceback (most recent call last):
        ...
        rlf_trainer.config.ConfigError: algorithm.guidance.enabled needs a demonstrator: algorithm.guidance.demonstrator (deepsearch-oracle, deepsearch-oracle-kinds or module:callable), or algorithm.guidance.base_url with algorithm.guidance.model
    """
    key = "algorithm.guidance"
    if not guidance.enabled:
        return
    if algorithm.name != "grpo":
        raise ConfigError(f"{key} mixes demonstrations into GRPO groups: it needs algorithm.name=grpo")
    if algorithm.group_size < 2:
        raise ConfigError(
            f"{key} needs algorithm.group_size >= 2: a demonstration alone in its group has no baseline"
        )
    if algorithm.loss == "gspo":
        raise ConfigError(
            f"{key} shapes the demonstration's token probabilities (LUFFY), which gspo's one ratio per "
            "sequence does not have: use algorithm.loss grpo, dr_grpo or dapo"
        )
    if guidance.probability == 0:
        raise ConfigError(
            f"{key}.probability=0 never guides a group: set it in (0, 1] or turn {key}.enabled off"
        )
    from rlf_envs.tasks.deepsearch.oracle import ORACLE_AGENTS

    oracles = ", ".join(ORACLE_AGENTS)
    if bool(guidance.demonstrator) == bool(guidance.base_url):
        raise ConfigError(
            f"{key}.enabled needs {'one' if guidance.demonstrator else 'a'} demonstrator: {key}.demonstrator "
            f"({oracles} or module:callable), or {key}.base_url with {key}.model"
        )
    if bool(guidance.base_url) != bool(guidance.model):
        raise ConfigError(f"{key}.base_url and {key}.model go together (the endpoint and its model name)")
    if guidance.max_hops is not None and guidance.demonstrator not in ORACLE_AGENTS:
        raise ConfigError(
            f"{key}.max_hops limits the scripted DeepSearch oracle: set {key}.demonstrator to one of {oracles}"
        )


class Config(Section):
    """The whole training run. See docs/trainer.md for every field."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    seed: int = 0
    max_steps: int = Field(100, ge=0)
    # auto: bf16 where the chip has bf16 arithmetic, else fp32 (rlf_trainer.run.precision)
    mixed_precision: Annotated[Literal["auto", "no", "bf16", "fp16"], BeforeValidator(_yaml_no)] = "auto"
    gradient_checkpointing: bool = False
    compile: bool = False  # torch.compile each decoder layer for the update (rlf_trainer.run.compile)
    # the update forwards a micro-batch's common prefix (a group's prompt) once; auto: on a CPU
    # (rlf_trainer.algorithms.shared_prefix, optimize.shares_prefix)
    shared_prefix: Literal["auto"] | bool = "auto"

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

    def validate(self) -> Config:  # type: ignore[override]  # pydantic's is a deprecated v1 classmethod
        """Check the rules that tie several fields together; returns self. Raises :class:`ConfigError`.

        Types and ranges were checked when the config was built.
        """
        algo, rollout = self.algorithm, self.rollout
        if rollout.max_total_tokens <= rollout.max_new_tokens:
            raise ConfigError(
                f"rollout.max_total_tokens must exceed rollout.max_new_tokens "
                f"({rollout.max_total_tokens} <= {rollout.max_new_tokens})"
            )
        if not (self.model.path or self.model.prepare):
            raise ConfigError("model.path is required (or model.prepare)")
        if algo.name == "sft" and not self.sft.data:
            raise ConfigError(
                "algorithm.name=sft needs sft.data: a chat-messages JSONL file (rlf-collect writes one)"
            )
        try:
            clip_range(algo.loss, algo.clip_eps_low, algo.clip_eps_high)
        except ValueError:  # the rule is clip_range's; the wording names the config's keys
            raise ConfigError(
                f"{algo.loss} clips symmetrically: leave algorithm.clip_eps_high unset or use algorithm.loss=dapo"
            ) from None
        if algo.overlong_buffer > rollout.max_new_tokens:
            raise ConfigError(
                f"algorithm.overlong_buffer must be in [0, rollout.max_new_tokens] "
                f"({algo.overlong_buffer} > {rollout.max_new_tokens})"
            )
        single_pass = algo.num_iterations == 1 and algo.mini_batches == 1
        if (
            single_pass
            and algo.old_logprobs == "recompute"
            and (algo.clip_eps_low is not None or algo.clip_eps_high is not None)
        ):
            logging.getLogger(__name__).warning(
                "algorithm.clip_eps_low/high are ignored: with one optimizer pass over a batch and "
                "old_logprobs=recompute the ratio is exactly 1 and nothing is clipped (set "
                "algorithm.num_iterations > 1, algorithm.mini_batches > 1 or old_logprobs=rollout)"
            )
        check_guidance(algo.guidance, algo)
        if algo.loss == "gspo" and algo.turn_rewards != "sum":
            raise ConfigError("gspo has one ratio per sequence: algorithm.turn_rewards must be 'sum'")
        if rollout.overlap and self.policy.backend == "remote":
            raise ConfigError(
                "rollout.overlap is the colocated vLLM's; with policy.backend=remote set "
                "rollout.max_staleness=1 to roll out on the servers while the trainer trains"
            )
        if rollout.overlap and self.policy.backend != "vllm":
            raise ConfigError(
                "rollout.overlap needs policy.backend=vllm: the HF policy generates with the very "
                "module being trained, so the next rollout cannot run during the update"
            )
        self._validate_remote()
        env_turns = self.env.kwargs.get("max_turns")
        if rollout.max_turns is not None and env_turns is not None and env_turns != rollout.max_turns:
            raise ConfigError(
                f"max_turns is set twice, rollout.max_turns={rollout.max_turns} and "
                f"env.kwargs.max_turns={env_turns}: drop one (rollout.max_turns is passed to the env)"
            )
        # `auto` and None are resolved here, once, so the run (and its config.yaml) has one value.
        if (
            rollout.mode == "auto"
        ):  # async needs a continuously batching engine; HF generate is batch-synchronous
            rollout.mode = "lockstep" if self.policy.backend == "hf" else "async"
        if algo.tis_cap is None:  # the overlap's one-step-stale samples need the correction
            algo.tis_cap = 2.0 if rollout.overlap or rollout.max_staleness > 0 else 0.0
        return self

    def _validate_remote(self) -> None:
        """The rules of ``policy.backend: remote`` and ``rollout.max_staleness``."""
        remote, staleness = self.policy.remote, self.rollout.max_staleness
        if self.policy.backend != "remote":
            if staleness > 0:
                raise ConfigError(
                    "rollout.max_staleness is for policy.backend=remote (the colocated vLLM's "
                    "one-step overlap is rollout.overlap)"
                )
            return
        if not remote.urls:
            raise ConfigError(
                "policy.backend=remote needs policy.remote.urls: the inference servers, e.g. "
                "'policy.remote.urls=[\"http://127.0.0.1:8000\"]'"
            )
        for url in remote.urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"policy.remote.urls: {url!r} is not an http(s) URL")
        if remote.sync_every > 0 and remote.sync_every - 1 > staleness:
            raise ConfigError(
                f"policy.remote.sync_every={remote.sync_every} leaves the servers up to "
                f"{remote.sync_every - 1} versions behind, more than rollout.max_staleness={staleness}: "
                f"every such sample would be dropped; raise rollout.max_staleness to "
                f"{remote.sync_every - 1} or push every step"
            )

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (YAML/JSON-friendly where the values are)."""
        return self.model_dump()


# ---------------------------------------------------------------------------------------------------
# Loading and overriding
# ---------------------------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: list[str] | tuple[str, ...] = (),
    values: Mapping[str, Any] | None = None,
) -> Config:
    """A validated :class:`Config` from a YAML file (or the defaults when ``path`` is None) plus overrides.

    Each override is ``dotted.key=value``; keys inside a dict field (``env.kwargs``) may be new.
    ``values`` maps dotted keys to Python values, set after the overrides: a command line's typed
    flags, which need no YAML round trip.

    Example:
        >>> load_config(None, ["model.path=a"], values={"model.path": "b: c", "env.kwargs.top_k": 2}).model.path
        'b: c'
    """
    data: dict[str, Any] = {}
    if path is not None:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping, got {type(loaded).__name__}")
        data = loaded
    for override in overrides:
        key, value = parse_override(override)
        _set_dotted(data, key.split("."), value)
    for key, value in (values or {}).items():
        _set_dotted(data, key.split("."), value)
    return from_dict(data).validate()


def parse_override(text: str) -> tuple[str, Any]:
    """``"optim.lr=1e-6"`` -> ``("optim.lr", 1e-06)``; the value follows YAML rules.

    YAML 1.1 reads ``1e-6`` (no dot) as a string; number fields accept such strings as floats.
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
    """Build a :class:`Config` from nested dicts, checking every key, type and range (not ``validate``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping, got {type(data).__name__}: {data!r}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, Config)) from None


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
