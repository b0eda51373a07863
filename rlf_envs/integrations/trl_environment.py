"""Drive an RLF env from TRL's ``GRPOTrainer``: TRL generates, our env runs the tools and scores.

TRL (>= 1.0) runs multi-turn tool use itself when given an ``environment_factory``: a class whose
public methods are the tools, with ``reset(**row)`` called before each rollout. TRL renders the tools
into the prompt with the model's chat template, parses the tool calls out of each completion, calls
the matching methods, appends their results and generates again. This module builds such a class from
any RLF env id through the Gymnasium API only:

- one :class:`~rlf_envs.core.vector.ToolVectorEnv` holds every rollout's episode (one slot per rollout);
- each tool of the env (MCP or python) becomes an async method with the tool's schema; calling it
  steps the rollout's episode with a ``<tool_call>`` action, so our env runs the call (timeouts,
  error kinds, result truncation) and the method returns the tool's text;
- :func:`rlf_env_reward` ends every episode with the rollout's final assistant text and returns the
  env's reward, computed by the task (all episodes of the batch concurrently).

Importing this module imports neither TRL nor torch: :func:`prepare_tokenizer`, :func:`cpu_grpo_config`
and :func:`env_dataset` import ``transformers``/``trl``/``datasets`` when called.
``examples/third_party/trl_grpo.py`` is a runnable script built on it.

Example:
    >>> from trl import GRPOTrainer
    >>> from rlf_envs.integrations.trl_environment import (
    ...     cpu_grpo_config, env_dataset, make_trl_environment, prepare_tokenizer, rlf_env_reward)
    >>> Env = make_trl_environment("RLF/Codebook-v0", capacity=8, max_turns=3)
    >>> trainer = GRPOTrainer(model=path, reward_funcs=[rlf_env_reward],  # a model folder at path
    ...                       args=cpu_grpo_config("out", prompts=2, generations=4, max_turns=3),
    ...                       train_dataset=env_dataset("RLF/Codebook-v0", 16, max_turns=3),
    ...                       processing_class=prepare_tokenizer(path),
    ...                       environment_factory=Env)                                # doctest: +SKIP
    >>> trainer.train()                                                               # doctest: +SKIP
    >>> Env.close()
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from rlf_envs.info_keys import MESSAGES, REWARD_INFO, TOOL_MESSAGES

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


def _annotation(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if isinstance(kind, list):  # ["string", "null"] and the like
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if kinds else "string"
    if kind is None and "anyOf" in schema:
        kinds = [s.get("type") for s in schema["anyOf"] if s.get("type") not in (None, "null")]
        kind = kinds[0] if kinds else "string"
    return _JSON_TYPES.get(kind, str)


def _one_line(text: str) -> str:
    return " ".join(str(text).split()) or "(no description)"


def tool_method(tool: dict[str, Any], call: Callable[[Any, str, dict[str, Any]], Any]) -> Callable[..., Any]:
    """An async method with ``tool``'s name, typed parameters and a Google docstring.

    TRL (through ``transformers.utils.get_json_schema``) reads a tool's schema from its signature and
    docstring, so the method carries the env's schema in that form; calling it awaits
    ``call(self, name, arguments)``.
    """
    function = tool["function"]
    name = function["name"]
    parameters = function.get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    doc_args = []
    # required parameters first: a Python signature cannot put defaults before them
    for arg in sorted(properties, key=lambda a: a not in required):
        annotation = _annotation(properties[arg])
        if arg in required:
            params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, annotation=annotation))
        else:
            annotation = annotation | None
            params.append(
                inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)
            )
        annotations[arg] = annotation
        doc_args.append(f"    {arg}: {_one_line(properties[arg].get('description') or arg)}")

    async def method(self: Any, **arguments: Any) -> str:
        given = {k: v for k, v in arguments.items() if v is not None or k in required}
        return await call(self, name, given)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    args_block = ("\n\nArgs:\n" + "\n".join(doc_args)) if doc_args else ""
    method.__doc__ = (
        f"{_one_line(function.get('description') or name)}{args_block}\n\nReturns:\n    The tool's result."
    )
    return method


class _SlotEnvBase:
    """Behaviour shared by every generated environment class (see :func:`make_trl_environment`)."""

    _vec: Any = None
    _capacity: int = 0
    _next_slot: int = 0
    _lock = threading.Lock()

    def __init__(self) -> None:
        cls = type(self)
        with cls._lock:
            if cls._next_slot >= cls._capacity:
                raise RuntimeError(
                    f"{cls.__name__} has {cls._capacity} slots, all taken: pass a larger capacity "
                    "(at least the trainer's generation batch, prompts x generations)"
                )
            self._slot = cls._next_slot
            cls._next_slot += 1
        self._final: tuple[float, dict[str, Any]] | None = None
        self.last_reward_info: dict[str, Any] = {}

    @classmethod
    def close(cls) -> None:
        """Close the shared vector env and its tool servers (a classmethod: TRL would take a function for a tool)."""
        cls._vec.close()

    def reset(self, task_index: int | None = None, **_row: Any) -> None:
        """Start this rollout's episode on the row's instance; the prompt is already in the row."""
        options = {"task_index": int(task_index)} if task_index is not None else None
        asyncio.run(self._vec.areset_one(self._slot, options=options))
        self._final = None
        self.last_reward_info = {}
        return None

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        action = f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"
        obs, reward, terminated, truncated, info = await self._vec.astep_one(self._slot, action)
        if terminated or truncated:
            self._final = (float(reward), info)
            return "The episode is over (turn limit reached): give your final answer."
        messages = info.get(TOOL_MESSAGES) or []
        return "\n".join(str(m.get("content", "")) for m in messages) if messages else obs

    async def _finish(self, final_text: str) -> float:
        """End the episode with the rollout's last assistant text and return the env's reward."""
        if self._final is None:
            _, reward, terminated, truncated, info = await self._vec.astep_one(self._slot, final_text)
            if not (terminated or truncated):
                # the text still held a tool call: TRL stopped the loop, the episode is over all the same
                _, reward, _, _, info = await self._vec.astep_one(self._slot, "<answer></answer>")
            self._final = (float(reward), info)
        reward, info = self._final
        self.last_reward_info = dict(info.get(REWARD_INFO) or {})
        return reward


def make_trl_environment(env_id: str, capacity: int, **env_kwargs: Any) -> type:
    """A class for ``GRPOTrainer(environment_factory=...)`` over ``gym.make_vec(env_id, capacity)``.

    Each instance TRL creates takes one slot of the shared vector env, so ``capacity`` must be at least
    the number of rollouts in a generation batch. ``env_kwargs`` go to ``gym.make_vec`` (task and env
    options: ``max_turns``, ``mcp_servers``, ``tasks``, ``reward``, ...). Close it with ``cls.close()``.

    Example:
        >>> import inspect
        >>> Env = make_trl_environment("RLF/Codebook-v0", capacity=8, max_turns=3)
        >>> [m for m in vars(Env) if not m.startswith("_")]   # one method per tool of the env
        ['lookup']
        >>> inspect.signature(Env.lookup)   # the tool's schema as keyword arguments (plus reset and close)
        <Signature (self, *, word: str) -> str>
        >>> Env.close()
    """
    vec = gym.make_vec(env_id, num_envs=capacity, autoreset_mode="Disabled", **env_kwargs)
    tools: list[dict[str, Any]] = list(vec.unwrapped.tools)
    namespace: dict[str, Any] = {
        "_vec": vec.unwrapped,
        "_capacity": capacity,
        "_next_slot": 0,
        "_lock": threading.Lock(),
        "_env_id": env_id,
        "__doc__": f"TRL environment over {env_id}: tools {[t['function']['name'] for t in tools]}.",
    }
    reserved = {"reset", "get_reward", "close"}
    for tool in tools:
        name = tool["function"]["name"]
        if name in reserved or name.startswith("_") or not name.isidentifier():
            raise ValueError(f"tool name {name!r} cannot be a TRL environment method")
        namespace[name] = tool_method(tool, lambda self, n, a: self._call_tool(n, a))

    safe_name = "".join(ch if ch.isalnum() else "_" for ch in env_id)
    return type(f"TRL_{safe_name}", (_SlotEnvBase,), namespace)


async def rlf_env_reward(completions: list[Any], environments: Sequence[Any], **_: Any) -> list[float]:
    """TRL reward function: each rollout's env reward, its episode ended with the final assistant text.

    Pass it in ``reward_funcs``; TRL logs it as ``rewards/rlf_env_reward/mean``. All episodes are
    scored concurrently (the task's reward is async: judges and tool-based rewards overlap).
    """

    def final_text(completion: Any) -> str:
        if isinstance(completion, str):
            return completion
        for message in reversed(completion):
            if message.get("role") == "assistant":
                content = message.get("content") or ""
                return content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        return ""

    return list(
        await asyncio.gather(
            *(env._finish(final_text(c)) for env, c in zip(environments, completions, strict=True))
        )
    )


def env_dataset(env_id: str, num_prompts: int, split: str = "train", **env_kwargs: Any) -> Any:
    """A ``datasets.Dataset`` of ``{"prompt": env messages, "task_index": i}`` read through ``reset``."""
    from datasets import Dataset

    env = gym.make(env_id, **env_kwargs)
    rows = []
    try:
        for index in range(num_prompts):
            _, info = env.reset(seed=index, options={"task_index": index, "split": split})
            rows.append({"prompt": info[MESSAGES], "task_index": index})
    finally:
        env.close()
    return Dataset.from_list(rows)


def prepare_tokenizer(model_path: str | os.PathLike[str]) -> Any:
    """The model's tokenizer with a response parser TRL can use for Hermes/Qwen-style tool calls."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, qwen3_schema, qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    tokenizer.padding_side = "left"
    try:
        add_response_schema(tokenizer)  # known templates (Qwen3, Llama 3, ...)
    except ValueError:
        # our tiny Qwen3 (and other ChatML/Hermes templates) write calls exactly as Qwen3 does
        if hasattr(tokenizer, "response_template"):
            tokenizer.response_template = qwen3_template
        else:  # pragma: no cover - transformers < 5.13
            tokenizer.response_schema = qwen3_schema
    return tokenizer


def cpu_grpo_config(
    output_dir: str | os.PathLike[str],
    *,
    prompts: int,
    generations: int,
    max_turns: int,
    max_completion_length: int = 64,
    max_steps: int = 2,
    learning_rate: float = 1e-5,
    seed: int = 0,
    **overrides: Any,
) -> Any:
    """A TRL ``GRPOConfig`` shaped like an RLF run: fp32 on the CPU, ``prompts x generations`` a step.

    ``max_turns`` counts model turns as our env does (the first answer plus one turn per tool round),
    so TRL gets ``max_tool_calling_iterations = max_turns - 1``. TRL's own defaults that differ from
    our trainer's (bf16 autocast, gradient checkpointing, checkpoint saving, reporting) are turned off;
    ``overrides`` go to ``GRPOConfig`` last (``generation_kwargs``, ``loss_type``, ``use_cpu=False``...).

    Example:
        >>> config = cpu_grpo_config("/tmp/trl", prompts=2, generations=4, max_turns=3)  # writes nothing yet
        >>> config.per_device_train_batch_size, config.max_tool_calling_iterations, config.use_cpu
        (8, 2, True)
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    from trl import GRPOConfig

    settings: dict[str, Any] = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": prompts * generations,
        "num_generations": generations,
        "max_completion_length": max_completion_length,
        "max_tool_calling_iterations": max_turns - 1,
        "max_steps": max_steps,
        "learning_rate": learning_rate,
        "beta": 0.0,
        "seed": seed,
        "logging_steps": 1,
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "gradient_checkpointing": False,
        "save_strategy": "no",
    }
    settings.update(overrides)
    return GRPOConfig(**settings)
