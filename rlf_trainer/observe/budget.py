"""The token budget, checked before the first step: does the longest prompt leave the model room to speak?

A prompt is the system prompt + the tool schemas + the task's question, rendered with the chat
template exactly as the rollout renders it (:func:`rlf_trainer.rollout.chat.prompt_ids`). When the longest
one reaches ``rollout.max_total_tokens`` (or the model's context), every episode on it would end
before the model said a word and train on nothing: :func:`check_prompt_budget` raises
:class:`PromptBudgetError` with the numbers instead. The trainer calls it at construction; RLF
Studio can call it at Start.

Example:
    >>> tools = [{"type": "function", "function": {"name": "search", "description": "Search the web.",
    ...           "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]
    >>> prompts = [("q1", [{"role": "user", "content": "Who wrote Dune?"}])]  # (task id, messages)
    >>> budget = check_prompt_budget(tok, prompts, tools, max_total_tokens=1024)
    >>> budget.tool_schema_tokens, budget.room
    (206, 791)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlf_trainer.rollout import chat

Prompt = tuple[str | None, list[dict[str, Any]]]  # (task id, the reset messages)


@dataclass(frozen=True)
class PromptBudget:
    """The longest prompt's tokens, split into its parts, against the budget."""

    system_tokens: int
    tool_schema_tokens: int
    task_tokens: int
    prompt_tokens: int  # the three together: the whole first-turn prompt
    task_id: str | None
    max_total_tokens: int
    context_length: int | None

    @property
    def limit(self) -> int:
        """Tokens an episode may hold: ``max_total_tokens``, or the model's context when smaller."""
        if self.context_length is None:
            return self.max_total_tokens
        return min(self.max_total_tokens, self.context_length)

    @property
    def room(self) -> int:
        """Tokens left for the model's turns (and tool results) after the longest prompt."""
        return self.limit - self.prompt_tokens

    def describe(self) -> str:
        task = f" (task {self.task_id!r})" if self.task_id is not None else ""
        context = f", model context {self.context_length}" if self.context_length is not None else ""
        return (
            f"system prompt {self.system_tokens} + tool schemas {self.tool_schema_tokens} + longest task "
            f"prompt {self.task_tokens}{task} = {self.prompt_tokens} tokens; budget: "
            f"rollout.max_total_tokens={self.max_total_tokens}{context}"
        )


class PromptBudgetError(ValueError):
    """The longest prompt leaves the model no room: every episode would end before it said a word."""

    def __init__(self, budget: PromptBudget) -> None:
        super().__init__(
            f"the prompt does not fit the token budget: {budget.describe()}. Raise "
            "rollout.max_total_tokens (within the model's context), shorten the system prompt, or "
            "connect fewer tools"
        )
        self.budget = budget


def check_prompt_budget(
    tokenizer: Any,
    prompts: Sequence[Prompt],
    tools: list[dict[str, Any]],
    *,
    max_total_tokens: int,
    context_length: int | None = None,
) -> PromptBudget:
    """The budget of the longest of ``prompts`` with ``tools``; :class:`PromptBudgetError` when it leaves no room."""
    if not prompts:
        raise ValueError("no prompts to check the budget of")
    rendered = [
        (task_id, messages, len(chat.prompt_ids(tokenizer, messages, tools))) for task_id, messages in prompts
    ]
    task_id, messages, total = max(rendered, key=lambda r: r[2])
    without_tools = len(chat.prompt_ids(tokenizer, messages, []))
    system = [m for m in messages if m.get("role") == "system"]
    system_tokens = len(chat.prompt_ids(tokenizer, system, [])) if system else 0
    budget = PromptBudget(
        system_tokens=system_tokens,
        tool_schema_tokens=total - without_tools,
        task_tokens=without_tools - system_tokens,
        prompt_tokens=total,
        task_id=task_id,
        max_total_tokens=max_total_tokens,
        context_length=context_length,
    )
    if budget.room <= 0:
        raise PromptBudgetError(budget)
    return budget


def env_prompts(envs: Any, split: str, *, longest: int = 8) -> tuple[list[Prompt], list[dict[str, Any]]]:
    """The first-turn prompts of ``envs``' ``split`` and its tools, for :func:`check_prompt_budget`.

    An RLF vector env shows its task: the ``longest`` questions (by characters) of the split are
    rendered as the env renders them at reset (system prompt, then the question). Any other
    Gymnasium vector env is reset once over its first ``num_envs`` tasks and its reset infos used.
    """
    env = getattr(envs, "unwrapped", envs)
    task, tools = getattr(env, "task", None), getattr(env, "tools", None)
    if task is not None and tools is not None and callable(getattr(task, "instances", None)):
        instances = sorted(task.instances(split), key=lambda i: len(task.user_prompt(i)), reverse=True)
        prompts: list[Prompt] = [
            (
                str(instance.id),
                [
                    {"role": "system", "content": task.system_prompt},
                    {"role": "user", "content": task.user_prompt(instance)},
                ],
            )
            for instance in instances[:longest]
        ]
        return prompts, list(tools)
    from rlf_trainer.rollout.trajectory import env_info

    num_envs = int(envs.num_envs)
    _, infos = envs.reset(options={"task_indices": list(range(num_envs)), "split": split})
    infos = [env_info(infos, i) for i in range(num_envs)]
    return [(i.get("task_id"), list(i.get("messages") or [])) for i in infos], list(
        infos[0].get("tools") or []
    )


def model_context_length(model_config: Any, max_model_len: int | None = None) -> int | None:
    """The tokens a model attends over: ``max_position_embeddings`` (and a vLLM ``max_model_len`` cap)."""
    lengths = [n for n in (getattr(model_config, "max_position_embeddings", None), max_model_len) if n]
    return min(int(n) for n in lengths) if lengths else None


def check_run_budget(config: Any, envs: Any, tokenizer: Any, model_config: Any) -> PromptBudget:
    """:func:`check_prompt_budget` for a trainer :class:`~rlf_trainer.config.Config`'s env and model."""
    vllm_cap = config.policy.vllm.max_model_len if config.policy.backend == "vllm" else None
    prompts, tools = env_prompts(envs, config.env.train_split)
    return check_prompt_budget(
        tokenizer,
        prompts,
        tools,
        max_total_tokens=config.rollout.max_total_tokens,
        context_length=model_context_length(model_config, vllm_cap),
    )
