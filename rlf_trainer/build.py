"""What a run is built from: model path, tokenizer, model, reference model, envs, policy.

:class:`~rlf_trainer.trainer.Trainer` calls these once and hands the pieces to the steps as two
state objects: :class:`~rlf_trainer.rollout.collect.RolloutState` (policy, envs, prompt stream)
and :class:`~rlf_trainer.algorithms.optimize.Learner` (model, reference, optimizer, schedule).
An evaluation (``rlf-eval``, :mod:`rlf_trainer.eval_cli`) builds only the first, with
:func:`load_inference_model` instead of the model to train.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path
from typing import Any

import torch

from rlf_trainer.algorithms.optimize import Learner
from rlf_trainer.config import Config, ConfigError
from rlf_trainer.policy.base import Policy
from rlf_trainer.rollout.guidance import Demonstrator
from rlf_trainer.run.grouped_attention import use_grouped_sdpa
from rlf_trainer.run.schedule import lr_scheduler


def resolve_model_path(config: Config) -> str:
    """``model.path``, building the offline model first when ``model.prepare`` asks for one."""
    raw = os.path.expandvars(os.path.expanduser(config.model.path)) if config.model.path else ""
    prepare = config.model.prepare
    if prepare is None:
        return raw
    from rlf_trainer.data import models

    if prepare == "tiny-qwen3":
        return str(models.build_tiny_qwen3(raw or models.default_cache_dir() / "tiny-qwen3"))
    if raw and Path(raw).name != "smollm2-135m":
        raise ConfigError(
            "model.prepare=smollm2-135m builds <dir>/smollm2-135m: set model.path to such a folder"
        )
    return str(models.prepare_smollm2(Path(raw).parent if raw else None))


def import_object(spec: str) -> Any:
    """``"package.module:attr"`` -> the object (``"package.module.attr"`` works too)."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"import string {spec!r} is not of the form 'package.module:attr'")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {spec!r}: {exc}") from exc
    return obj


def env_kwargs(config: Config) -> dict[str, Any]:
    """The kwargs for ``gym.make_vec``: ``env.kwargs`` + resolved ``env.import_kwargs`` + rollout limits."""
    kwargs = dict(config.env.kwargs)
    for key, spec in config.env.import_kwargs.items():
        kwargs[key] = [import_object(s) for s in spec] if isinstance(spec, list) else import_object(spec)
    if config.rollout.max_turns is not None:
        kwargs["max_turns"] = config.rollout.max_turns
    kwargs["autoreset_mode"] = "Disabled"  # a finished episode must stay finished until the batch ends
    return kwargs


def load_tokenizer(config: Config, model_path: str) -> Any:
    """The tokenizer, with a pad token (eos when it has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=config.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _from_pretrained(config: Config, model_path: str) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = config.model.dtype
    model = AutoModelForCausalLM.from_pretrained(
        model_path,
        dtype=dtype if dtype == "auto" else getattr(torch, dtype),
        trust_remote_code=config.model.trust_remote_code,
    )
    use_grouped_sdpa(model)  # masked grouped-query attention without repeated key/value heads on a CPU
    return model


def load_model(config: Config, model_path: str) -> Any:
    """The model to train: gradient checkpointing and LoRA as configured, in train mode."""
    cfg = config
    model = _from_pretrained(config, model_path)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        if cfg.gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(
            model,
            PeftLoraConfig(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
                lora_dropout=cfg.lora.dropout,
                target_modules=cfg.lora.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    model.train()
    return model


def load_inference_model(config: Config, model_path: str) -> Any:
    """The model as an evaluation samples it: the weights alone (no LoRA adapters, no gradient
    checkpointing), in eval mode, without gradients."""
    model = _from_pretrained(config, model_path)
    model.requires_grad_(False)
    model.eval()
    return model


def load_reference(config: Config, model_path: str) -> Any:
    """A frozen copy of the initial model for the KL penalty (bf16 under bf16 mixed precision)."""
    ref = _from_pretrained(config, model_path)
    if config.mixed_precision == "bf16":
        ref = ref.to(torch.bfloat16)
    ref.requires_grad_(False)
    ref.eval()
    return ref


def make_envs(config: Config, num_envs: int) -> Any:
    """This process's vector env: ``local prompts x group_size`` envs."""
    import gymnasium as gym

    with contextlib.suppress(ImportError):
        import rlf_envs  # noqa: F401  (registers the RLF/* ids; other registered envs work too)
    return gym.make_vec(config.env.id, num_envs=num_envs, **env_kwargs(config))


def num_train_tasks(config: Config, envs: Any) -> int | None:
    """The train split's size: ``env.num_train_tasks``, else what the env reports, else None."""
    if config.env.num_train_tasks is not None:
        return config.env.num_train_tasks
    # Optional extension of the env contract: a vector env may report its split sizes.
    reporter = getattr(envs.unwrapped, "num_tasks", None)
    if callable(reporter):
        with contextlib.suppress(Exception):
            return int(reporter(config.env.train_split))
    return None


def make_policy(config: Config, accelerator: Any, model: Any, tokenizer: Any, model_path: str) -> Policy:
    """The sampling policy: the trained model itself (HF), a vLLM engine of its own, or remote servers."""
    cfg = config
    if cfg.policy.backend == "hf":
        from rlf_trainer.policy.hf import HFPolicy

        # under bf16 mixed precision the policy samples with a bf16 copy (synced after each step)
        dtype = torch.bfloat16 if cfg.mixed_precision == "bf16" else None
        return HFPolicy(
            accelerator.unwrap_model(model),
            tokenizer,
            prefix_cache_tokens=cfg.policy.hf_prefix_cache_tokens,
            generation_dtype=dtype,
        )
    if cfg.policy.backend == "remote":
        return make_remote_policy(config, tokenizer, model_path)
    from rlf_trainer.policy.vllm import VLLMPolicy

    v = cfg.policy.vllm
    return VLLMPolicy(
        model_path,
        tensor_parallel_size=v.tensor_parallel_size,
        gpu_memory_utilization=v.gpu_memory_utilization,
        enable_sleep_mode=v.enable_sleep_mode,
        dtype=v.dtype,
        max_model_len=v.max_model_len,
        seed=cfg.seed + accelerator.process_index,
        tokenizer=tokenizer,
    )


def make_demonstrator(config: Config) -> Demonstrator | None:
    """``algorithm.guidance``'s demonstrator, one of rlf-collect's agents (None when guidance is off).

    An endpoint is asked one tiny request first, so an unreachable one fails here, not mid-run.
    """
    import asyncio

    from rlf_trainer.data.demonstrations import CollectError, build_agent

    g = config.algorithm.guidance
    if not g.enabled:
        return None
    try:
        agent = build_agent(g.demonstrator, base_url=g.base_url, model=g.model, env_kwargs=config.env.kwargs,
                            temperature=g.temperature, max_tokens=g.max_tokens, max_hops=g.max_hops)  # fmt: skip
        check = getattr(agent, "check", None)
        if check is not None:
            asyncio.run(check())
    except CollectError as exc:
        raise ConfigError(f"algorithm.guidance: {exc}") from exc
    return agent


def make_remote_policy(config: Config, tokenizer: Any, model_path: str) -> Policy:
    """``policy.backend: remote``: the inference servers of ``policy.remote`` (weights written under
    ``policy.remote.weights_dir``, default ``<run dir>/remote_weights``)."""
    from transformers import GenerationConfig

    from rlf_trainer.policy.remote import RemotePolicy

    r = config.policy.remote
    weights_dir = os.path.expandvars(os.path.expanduser(r.weights_dir)) if r.weights_dir else None
    try:  # its eos ids end completions too
        generation_config = GenerationConfig.from_pretrained(model_path)
    except OSError:  # the folder has no generation_config.json
        generation_config = None
    return RemotePolicy(
        r.urls,
        tokenizer,
        generation_config=generation_config,
        weights_dir=weights_dir or config.run_dir / "remote_weights",
        model_name=r.model,
        request_timeout_s=r.request_timeout_s,
        max_attempts=r.max_attempts,
        push_dtype=getattr(torch, r.push_dtype) if r.push_dtype else None,
    )


def learner(config: Config, accelerator: Any, model_path: str) -> Learner:
    """The update's state: the policy model (LoRA and gradient checkpointing as configured), the
    frozen reference when ``algorithm.beta`` > 0 without LoRA, AdamW and the LR schedule; the
    model and optimizer prepared by Accelerate (the reference is not: it would be saved in every
    checkpoint)."""
    model = load_model(config, model_path)
    ref_model = (
        load_reference(config, model_path) if config.algorithm.beta > 0 and not config.lora.enabled else None
    )
    o = config.optim
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=o.lr,
        betas=(o.adam_beta1, o.adam_beta2),
        eps=o.adam_eps,
        weight_decay=o.weight_decay,
        # on a CPU torch's default AdamW loops over the parameters op by op, a pass over memory
        # per op; the fused kernel makes one pass (GPUs keep the default: foreach, untimed here)
        fused=accelerator.device.type == "cpu",
    )
    model, optimizer = accelerator.prepare(model, optimizer)
    # Stepped by hand once per trainer step (Accelerate's wrapper would step it once per process).
    scheduler = lr_scheduler(optimizer, o, total_steps=config.max_steps)
    accelerator.register_for_checkpointing(scheduler)
    if ref_model is not None:  # a frozen full copy per process (bf16 under bf16 mixed precision)
        ref_model.to(accelerator.device)
    return Learner(config, accelerator, model, ref_model, optimizer, scheduler)


def prepared_model_path(config: Config, accelerator: Any) -> str:
    """``model.path``, the offline model built first where asked (by the main process first)."""
    with accelerator.main_process_first():
        return resolve_model_path(config)
