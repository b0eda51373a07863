"""Start's token check: the trainer's own prompt-budget check, run before any process starts.

An episode's tokens are the prompt (system prompt + every tool's JSON schema + the task) plus every
turn; ``rollout.max_total_tokens`` caps the sum. Twelve tool schemas easily take 3,000 tokens, so a
1,024-token budget leaves the model nothing to say, and every episode ends empty with loss 0. The
trainer refuses such a run before step 1 (:func:`rlf_trainer.observe.budget.check_run_budget`); the
studio's Start calls that same check on the form's config, so the refusal comes at once, in the
form's words, and not from a subprocess after the model has loaded. This module adds only what
the studio needs around it: the form's model name to a tokenizer, and the words.

Example:
    >>> from rlf_trainer.observe.budget import PromptBudget
    >>> budget = PromptBudget(system_tokens=30, tool_schema_tokens=2800, task_tokens=200,
    ...                       prompt_tokens=3030, task_id="t1", max_total_tokens=1024, context_length=None)
    >>> BudgetReport(budget, num_tools=12, max_new_tokens=64).problem()
    'the longest train prompt takes 3030 tokens (2800 of them the 12 tool schemas) but the episode budget (tokens per episode, rollout.max_total_tokens) is 1024: raise it above 3094, or connect fewer tools'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

import rlf_envs  # noqa: F401  (registers the RLF/* ids)
from rlf_trainer.config import from_dict
from rlf_trainer.observe.budget import PromptBudget, PromptBudgetError, check_prompt_budget, check_run_budget

_PROBE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "hi"},
]


class BudgetError(ValueError):
    """The model's tokenizer or the env's prompts cannot be read (a missing folder, an env that fails)."""


@dataclass(frozen=True)
class BudgetReport:
    """The trainer's :class:`~rlf_trainer.observe.budget.PromptBudget` of a form, in the form's words."""

    budget: PromptBudget
    num_tools: int
    max_new_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return self.budget.prompt_tokens

    @property
    def tool_tokens(self) -> int:
        return self.budget.tool_schema_tokens

    def problem(self) -> str:
        """Why the run cannot train ('' when it can): the trainer's verdict, ``room <= 0``."""
        b = self.budget
        if b.room > 0:
            return ""
        by_context = b.context_length is not None and b.context_length < b.max_total_tokens
        limit = (
            f"the model's context is {b.context_length} tokens: pick a model with a longer context"
            if by_context
            else f"the episode budget (tokens per episode, rollout.max_total_tokens) is {b.max_total_tokens}: "
            f"raise it above {b.prompt_tokens + self.max_new_tokens}"
        )
        return (
            f"the longest train prompt takes {b.prompt_tokens} tokens ({b.tool_schema_tokens} of them "
            f"the {self.num_tools} tool schemas) but {limit}, or connect fewer tools"
        )

    def words(self) -> str:
        """The numbers in one line, for a run that fits."""
        b = self.budget
        tight = " (less than one turn: the first answer may be cut)" if b.room < self.max_new_tokens else ""
        capped = ", capped by the model's context" if b.limit < b.max_total_tokens else ""
        return (
            f"prompt {b.prompt_tokens} tokens (tool schemas {b.tool_schema_tokens}) of "
            f"{b.limit}{capped}: {b.room} left for the episode{tight}"
        )


def model_folder(model: str) -> Path | None:
    """The local folder of ``model``: a prepared name (built when needed), a folder, or None for a hub id.

    :class:`BudgetError` for a path that does not exist (a hub id looks like ``org/name``).
    """
    from rlf_trainer.data import models

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


def _from_pretrained(kind: Any, model: str) -> Any | None:
    """``kind.from_pretrained`` on the model's folder, or on the local cache of a hub id (None: not here)."""
    folder = model_folder(model)
    try:
        if folder is not None:
            return kind.from_pretrained(folder)
        return kind.from_pretrained(model.strip(), local_files_only=True)
    except (OSError, ValueError) as exc:
        if folder is not None:
            raise BudgetError(f"cannot load the {kind.__name__} of {model!r}: {exc}") from None
        return None


def load_tokenizer(model: str) -> Any | None:
    """The model's tokenizer (None for a hub id not in the local cache: the trainer downloads it)."""
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, model)


def schema_tokens(tokenizer: Any, tools: list[dict[str, Any]]) -> int:
    """How many prompt tokens the tool schemas (OpenAI function format) add under the chat template.

    The trainer's own count (:func:`rlf_trainer.observe.budget.check_prompt_budget`) on a two-message chat.
    """
    if not tools:
        return 0
    probe = check_prompt_budget(tokenizer, [(None, _PROBE_MESSAGES)], tools, max_total_tokens=10**9)
    return probe.tool_schema_tokens


def check_budget(model: str, data: dict[str, Any]) -> BudgetReport | None:
    """The trainer's budget check on the config ``data`` (a checked studio config) for ``model``.

    None when the tokenizer is not on this machine (the trainer checks it after downloading);
    :class:`BudgetError` when the model or the env cannot be read. The env is made from
    ``env.kwargs`` alone: ``env.import_kwargs`` (a project's Python reward) only score episodes.
    """
    from transformers import AutoConfig

    tokenizer = load_tokenizer(model)
    if tokenizer is None:
        return None
    model_config = _from_pretrained(AutoConfig, model)
    config = from_dict(data)
    kwargs = dict(config.env.kwargs)
    if config.rollout.max_turns is not None:
        kwargs["max_turns"] = config.rollout.max_turns
    try:
        env = gym.make(config.env.id, **kwargs)
    except Exception as exc:
        raise BudgetError(f"the env {config.env.id} could not start: {type(exc).__name__}: {exc}") from None
    try:
        num_tools = len(env.unwrapped.tools)  # starts the env's tools
        budget = check_run_budget(config, env, tokenizer, model_config)
    except PromptBudgetError as exc:
        budget = exc.budget
    except Exception as exc:
        raise BudgetError(f"the env {config.env.id} could not start: {type(exc).__name__}: {exc}") from None
    finally:
        env.close()
    return BudgetReport(budget, num_tools=num_tools, max_new_tokens=config.rollout.max_new_tokens)
