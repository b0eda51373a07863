"""Token counts before training: what the tool schemas cost, and whether the first prompt fits the budget.

An episode's tokens are the prompt (system prompt + every tool's JSON schema + the task) plus every
turn; ``rollout.max_total_tokens`` caps the sum. Twelve tool schemas easily take 3,000 tokens, so a
1,024-token budget leaves the model nothing to say, and every episode ends empty with loss 0. The
studio's Start therefore renders the longest train prompt with the model's own chat template (the
trainer's :func:`rlf_trainer.chat.render`) and refuses a run whose prompt does not fit.

Example:
    >>> from rlf_studio.budget import BudgetReport
    >>> report = BudgetReport(prompt_tokens=3030, tool_tokens=2800, num_tools=12, max_total_tokens=1024,
    ...                       max_new_tokens=64, context=None, model="m")
    >>> report.problem()
    'the longest train prompt takes 3030 tokens (2800 of them the 12 tool schemas) but the episode budget (tokens per episode, rollout.max_total_tokens) is 1024: raise it above 3094, or connect fewer tools'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

import rlf_envs  # noqa: F401  (registers the RLF/* ids)

PREPARED_FOLDERS = {"tiny-qwen3", "smollm2-135m"}
_PROBE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "hi"},
]


class BudgetError(ValueError):
    """The model's tokenizer or the env's prompts cannot be read (a missing folder, an env that fails)."""


@dataclass(frozen=True)
class BudgetReport:
    """The longest train prompt against the run's token budget and the model's context."""

    prompt_tokens: int
    tool_tokens: int
    num_tools: int
    max_total_tokens: int
    max_new_tokens: int
    context: int | None
    model: str

    def problem(self) -> str:
        """Why the run cannot train ('' when it can)."""
        if self.prompt_tokens >= self.max_total_tokens:
            return (
                f"the longest train prompt takes {self.prompt_tokens} tokens ({self.tool_tokens} of them "
                f"the {self.num_tools} tool schemas) but the episode budget (tokens per episode, "
                f"rollout.max_total_tokens) is {self.max_total_tokens}: raise it above "
                f"{self.prompt_tokens + self.max_new_tokens}, or connect fewer tools"
            )
        if self.context is not None and self.max_total_tokens > self.context:
            return (
                f"the episode budget ({self.max_total_tokens} tokens) exceeds the model's context of "
                f"{self.context} tokens: lower tokens per episode (rollout.max_total_tokens)"
            )
        return ""

    def words(self) -> str:
        """The numbers in one line, for a run that fits."""
        room = self.max_total_tokens - self.prompt_tokens
        tight = " (less than one turn: the first answer may be cut)" if room < self.max_new_tokens else ""
        return (
            f"prompt {self.prompt_tokens} tokens (tool schemas {self.tool_tokens}) of "
            f"{self.max_total_tokens}: {room} left for the episode{tight}"
        )


def model_folder(model: str) -> Path | None:
    """The local folder of ``model``: a prepared name (built when needed), a folder, or None for a hub id.

    :class:`BudgetError` for a path that does not exist (a hub id looks like ``org/name``).
    """
    from rlf_trainer import models

    model = (model or "").strip()
    if model == "tiny-qwen3":
        return models.build_tiny_qwen3(models.default_cache_dir() / "tiny-qwen3")
    if model == "smollm2-135m":
        folder = models.default_cache_dir() / "smollm2-135m"
        return folder if (folder / "config.json").is_file() else None  # the trainer prepares it
    path = Path(model).expanduser()
    looks_like_path = model.startswith(("/", ".", "~")) or model.count("/") != 1
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BudgetError(f"the model folder {model!r} holds no config.json: is it a Hugging Face model?")
        return path
    if looks_like_path:
        raise BudgetError(f"the model folder {model!r} does not exist")
    return None


def load_tokenizer(model: str) -> Any | None:
    """The model's tokenizer (None for a hub id not in the local cache: the trainer downloads it)."""
    from transformers import AutoTokenizer

    folder = model_folder(model)
    try:
        if folder is not None:
            return AutoTokenizer.from_pretrained(folder)
        return AutoTokenizer.from_pretrained(model.strip(), local_files_only=True)
    except (OSError, ValueError) as exc:
        if folder is not None:
            raise BudgetError(f"cannot load the tokenizer of {model!r}: {exc}") from None
        return None


def _count(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    from rlf_trainer.chat import encode, render

    return len(encode(tokenizer, render(tokenizer, messages, tools, add_generation_prompt=True)))


def schema_tokens(tokenizer: Any, tools: list[dict[str, Any]]) -> int:
    """How many prompt tokens the tool schemas (OpenAI function format) add under the chat template."""
    if not tools:
        return 0
    return _count(tokenizer, _PROBE_MESSAGES, tools) - _count(tokenizer, _PROBE_MESSAGES, None)


def _model_context(tokenizer: Any, folder: Path | None) -> int | None:
    if folder is not None and (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        value = config.get("max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    length = getattr(tokenizer, "model_max_length", None)
    return length if isinstance(length, int) and 0 < length < 10**8 else None


def longest_prompt(env_id: str, kwargs: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of the env's first observation for its longest train question."""
    try:
        env = gym.make(env_id, **kwargs)
    except Exception as exc:
        raise BudgetError(f"the env {env_id} could not start: {type(exc).__name__}: {exc}") from None
    try:
        instances = list(env.unwrapped.task.instances("train"))
        if not instances:
            raise BudgetError(f"the env {env_id} has no train tasks")
        index = max(range(len(instances)), key=lambda i: len(instances[i].question or ""))
        _, info = env.reset(options={"task_index": index, "split": "train"})
        return list(info["messages"]), list(info.get("tools") or [])
    finally:
        env.close()


def check_budget(
    model: str, env_id: str, kwargs: dict[str, Any], max_total_tokens: int, max_new_tokens: int
) -> BudgetReport | None:
    """The longest train prompt against the budget; None when the tokenizer is not on this machine."""
    tokenizer = load_tokenizer(model)
    if tokenizer is None:
        return None
    messages, tools = longest_prompt(env_id, kwargs)
    return BudgetReport(
        prompt_tokens=_count(tokenizer, messages, tools),
        tool_tokens=schema_tokens(tokenizer, tools),
        num_tools=len(tools),
        max_total_tokens=int(max_total_tokens),
        max_new_tokens=int(max_new_tokens),
        context=_model_context(tokenizer, model_folder(model)),
        model=model,
    )
