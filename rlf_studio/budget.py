"""Start's token check: does the token budget hold a whole episode, not only its prompt?

An episode's tokens are the prompt (system prompt + every tool's JSON schema + the task) plus every
turn plus the tool results between turns; ``rollout.max_total_tokens`` caps the sum, and the rollout
cuts an episode whose next turn or tool result does not fit (:mod:`rlf_trainer.rollout.trajectory`). Twelve
tool schemas easily take 3,000 tokens: a budget that holds the prompt and one turn still cuts every
episode that calls a tool before it reads the result. The trainer refuses only a prompt that
leaves no room at all (:func:`rlf_trainer.observe.budget.check_run_budget`, before step 1); the studio's
Start runs that same check on the form's config and then asks for room for the whole episode:
the prompt, ``max_turns`` turns of ``max_new_tokens``, and a tool result after every turn but the
last. A tool result's room is the longest result seen in the Tools or Playground tab, measured with
the model's chat template (:func:`result_tokens`), or :data:`DEFAULT_RESULT_TOKENS` until a tool
has been called. This module adds that and the words; the counting is the trainer's.

Example:
    >>> from rlf_trainer.observe.budget import PromptBudget
    >>> budget = PromptBudget(system_tokens=30, tool_schema_tokens=2880, task_tokens=159,
    ...                       prompt_tokens=3069, task_id="t1", max_total_tokens=3133, context_length=None)
    >>> report = BudgetReport(budget, num_tools=12, max_new_tokens=64, max_turns=2, result_tokens=256)
    >>> report.needed
    3453
    >>> print(report.problem())
    the longest train prompt takes 3069 tokens (2880 of them the 12 tool schemas) and an episode adds 2 turns of up to 64 tokens and 1 tool result of 256 tokens (an estimate: call a tool in the Tools or Playground tab to measure yours): 3453 tokens in all, but the episode budget (tokens per episode, rollout.max_total_tokens) is 3133: raise it to at least 3453, lower max turns or tokens per turn, or connect fewer tools
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

import rlf_envs  # noqa: F401  (registers the RLF/* ids)
from rlf_envs.core.env_runtime import EnvSettings
from rlf_envs.tools.toolbox import truncate_text
from rlf_envs.types import ToolCall
from rlf_trainer.config import from_dict
from rlf_trainer.observe.budget import PromptBudget, PromptBudgetError, check_prompt_budget, check_run_budget
from rlf_trainer.rollout import chat

# Room for one tool result (with the chat template's wrapping) until a tool has been called in the
# Tools or Playground tab: a short file, a search hit list, a few log lines.
DEFAULT_RESULT_TOKENS = 256

_PROBE_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "hi"},
]


class BudgetError(ValueError):
    """The model's tokenizer or the env's prompts cannot be read (a missing folder, an env that fails)."""


@dataclass(frozen=True)
class BudgetReport:
    """The trainer's :class:`~rlf_trainer.observe.budget.PromptBudget` of a form, the episode around it, in the form's words."""

    budget: PromptBudget
    num_tools: int
    max_new_tokens: int
    max_turns: int
    result_tokens: int  # one tool result's tokens, the chat template's wrapping included
    result_measured: bool = False  # result_tokens: the longest result seen, not DEFAULT_RESULT_TOKENS

    @property
    def prompt_tokens(self) -> int:
        return self.budget.prompt_tokens

    @property
    def tool_tokens(self) -> int:
        return self.budget.tool_schema_tokens

    @property
    def needed(self) -> int:
        """The tokens of the longest episode: the prompt, every turn at full length, a result after each but the last.

        The rollout cuts a turn at the budget and ends an episode whose next tool result does not
        fit, so this is the smallest budget at which no such episode is cut.
        """
        results = (self.max_turns - 1) * self.result_tokens
        return self.budget.prompt_tokens + self.max_turns * self.max_new_tokens + results

    def episode_words(self) -> str:
        """What an episode adds to its prompt, e.g. '2 turns of up to 64 tokens and 1 tool result of
        256 tokens (an estimate: ...)'; the source of the results' size in brackets."""
        turns = (
            f"{self.max_turns} turn{'s' if self.max_turns != 1 else ''} of up to {self.max_new_tokens} tokens"
        )
        results = self.max_turns - 1
        if results == 0:
            return turns
        source = (
            "the longest result seen in the Tools or Playground tab"
            if self.result_measured
            else "an estimate: call a tool in the Tools or Playground tab to measure yours"
        )
        plural = "s" if results != 1 else ""
        return f"{turns} and {results} tool result{plural} of {self.result_tokens} tokens ({source})"

    def problem(self) -> str:
        """Why the run cannot train ('' when it can): the budget (or the model's context) is below
        :attr:`needed`; the number it asks for is :attr:`needed` itself, the smallest that starts."""
        b = self.budget
        if b.limit >= self.needed:
            return ""
        by_context = b.context_length is not None and b.context_length < b.max_total_tokens
        limit = (
            f"the model's context is {b.context_length} tokens: pick a model with a longer context"
            if by_context
            else f"the episode budget (tokens per episode, rollout.max_total_tokens) is {b.max_total_tokens}: "
            f"raise it to at least {self.needed}"
        )
        return (
            f"the longest train prompt takes {b.prompt_tokens} tokens ({b.tool_schema_tokens} of them "
            f"the {self.num_tools} tool schemas) and an episode adds {self.episode_words()}: "
            f"{self.needed} tokens in all, but {limit}, lower max turns or tokens per turn, or connect fewer tools"
        )

    def words(self) -> str:
        """The numbers in one line, for a run that fits."""
        b = self.budget
        capped = ", capped by the model's context" if b.limit < b.max_total_tokens else ""
        return (
            f"prompt {b.prompt_tokens} tokens (tool schemas {b.tool_schema_tokens}) of {b.limit}{capped}: "
            f"{b.room} left for the episode, which may add {self.needed - b.prompt_tokens}: {self.episode_words()}"
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


def result_tokens(tokenizer: Any, tools: list[dict[str, Any]], text: str) -> int:
    """The tokens one tool result ``text`` adds to an episode: the chat template's delta after a
    tool-calling turn (:func:`rlf_trainer.rollout.chat.tool_delta_ids`, what the rollout appends), counted for
    a turn cut at its token limit (the end-of-turn token is then the delta's too)."""
    call = ToolCall("tool", {})
    before = [*_PROBE_MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call.to_openai()]}]
    result = {"role": "tool", "name": call.name, "tool_call_id": call.id, "content": text}
    return len(chat.tool_delta_ids(tokenizer, before, [result], tools, include_end_of_turn=True))


def check_budget(model: str, data: dict[str, Any], tool_result: str | None = None) -> BudgetReport | None:
    """The trainer's budget check on the config ``data`` (a checked studio config) for ``model``,
    with room for the whole episode (:attr:`BudgetReport.needed`).

    ``tool_result``: the longest tool result seen with the config's tools (None: none seen yet,
    :data:`DEFAULT_RESULT_TOKENS`); it is cut as the env cuts results (``max_result_chars``).
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
        tools = list(env.unwrapped.tools)  # starts the env's tools
        budget = check_run_budget(config, env, tokenizer, model_config)
    except PromptBudgetError as exc:
        budget = exc.budget
    except Exception as exc:
        raise BudgetError(f"the env {config.env.id} could not start: {type(exc).__name__}: {exc}") from None
    finally:
        env.close()
    room = DEFAULT_RESULT_TOKENS
    if tool_result is not None:
        cut, _ = truncate_text(tool_result, kwargs.get("max_result_chars", EnvSettings.max_result_chars))
        try:
            room = result_tokens(tokenizer, tools, cut)
        except ValueError as exc:  # a template that cannot extend a chat: the rollout would fail too
            raise BudgetError(f"the chat template of {model!r} cannot add a tool result: {exc}") from None
    return BudgetReport(
        budget,
        num_tools=len(tools),
        max_new_tokens=config.rollout.max_new_tokens,
        max_turns=config.rollout.max_turns or 1,  # the studio's form always sets it
        result_tokens=room,
        result_measured=tool_result is not None,
    )
