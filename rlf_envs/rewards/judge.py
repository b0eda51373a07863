"""LLM-as-judge reward: ask an OpenAI-compatible chat endpoint whether an episode's answer is right.

:class:`JudgeReward` is an async callable on an :class:`~rlf_envs.core.task.Episode`, so it drops
into any task as its reward (``gym.make("RLF/ToolUse-v0", reward=JudgeReward(...))``) and the
env scores every finished episode of a batch concurrently. It never raises: when the judge
cannot be reached (after retries with exponential backoff), answers with an HTTP error, or
replies without a score, the episode gets the declared ``fallback_score`` and
``judge_fallback: True`` with the reason in ``judge_error``.

The HTTP client underneath is :class:`rlf_envs.llm_client.OpenAIChatClient`, shared with the
agent MCP server and the user simulator.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> judge = JudgeReward("http://127.0.0.1:8000/v1", "qwen3-8b", max_concurrency=32)  # no request yet
    >>> tasks = [{"question": "Where was Tarin Vosk born?", "answer": "Leidax"}]
    >>> envs = gym.make_vec("RLF/ToolUse-v0", num_envs=64, tasks=tasks, reward=judge)
    >>> envs.close()
    >>> parse_score_tag("The answer names the right city. <score>1</score>")
    1.0
    >>> parse_yes_no("No, the reference says 1749.")
    0.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlf_envs.llm_client import ChatCompletionError, ChatErrorKind, OpenAIChatClient
from rlf_envs.rewards.rules import episode_prediction
from rlf_envs.types import Episode

ScoreParser = Callable[[str], float | None]

# --------------------------------------------------------------------------------------------------
# Score parsers
# --------------------------------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_SCORE_TAG = re.compile(r"<score>\s*(.*?)\s*</score>", re.DOTALL | re.IGNORECASE)
_LEADING_VERDICT = re.compile(r"^\W*(yes|no)\b", re.IGNORECASE)
_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def _without_thinking(text: str) -> str:
    """The reply without ``<think>`` blocks: a reasoning judge may try out scores while it thinks."""
    return _THINK.sub("", text)


def parse_score_tag(text: str) -> float | None:
    """The number in the last ``<score>...</score>`` block, or None when there is none in [0, 1].

    Example:
        >>> parse_score_tag("<think><score>0</score>?</think> Right. <score> 0.75 </score>")
        0.75
        >>> parse_score_tag("<score>7</score>") is None, parse_score_tag("score: 1") is None
        (True, True)
    """
    matches = _SCORE_TAG.findall(_without_thinking(text))
    if not matches:
        return None
    try:
        value = float(matches[-1])
    except ValueError:
        return None
    return value if math.isfinite(value) and 0.0 <= value <= 1.0 else None


def parse_yes_no(text: str) -> float | None:
    """1.0 for a "yes" verdict, 0.0 for "no", None for neither.

    A reply that starts with yes/no is that verdict; otherwise the last standalone yes/no word
    counts (judges tend to reason first and conclude last).

    Example:
        >>> parse_yes_no("Yes."), parse_yes_no("The dates differ, so the answer is: no"), parse_yes_no("maybe")
        (1.0, 0.0, None)
    """
    text = _without_thinking(text).strip()
    verdict = _LEADING_VERDICT.match(text)
    if verdict is None:
        words = _VERDICT.findall(text)
        if not words:
            return None
        word = words[-1]
    else:
        word = verdict.group(1)
    return 1.0 if word.lower() == "yes" else 0.0


SCORE_PARSERS: dict[str, ScoreParser] = {"score_tag": parse_score_tag, "yes_no": parse_yes_no}

# --------------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------------

_PROMPT_HEAD = """\
You are grading the answer to a question.

Question: {question}
Reference answer(s): {gold}
Candidate answer: {answer}

Decide whether the candidate answer is correct. A reference answer, when given, is correct; \
accept any candidate that means the same (other wording, capitalisation, punctuation, an alias, \
extra words that do not change the answer). Without a reference, judge from your own knowledge.
"""

SCORE_TAG_PROMPT = _PROMPT_HEAD + (
    "Reply with a score from 0 (wrong) to 1 (fully correct) inside <score></score> tags, "
    "for example <score>1</score>."
)
YES_NO_PROMPT = _PROMPT_HEAD + "Is the candidate answer correct? Reply with yes or no."
NO_REFERENCE = "(none given)"
PROMPT_FIELDS = ("question", "gold", "answer")


def render_prompt(template: str, *, question: str, answer: str, golds: Sequence[str]) -> str:
    """Fill a judge template's ``{question}``, ``{gold}`` (golds joined by " | ") and ``{answer}``.

    Example:
        >>> render_prompt("{question} / {gold} / {answer}", question="Q?", answer="a", golds=["x", "y"])
        'Q? / x | y / a'
    """
    gold = " | ".join(golds) if golds else NO_REFERENCE
    return template.format_map({"question": question, "gold": gold, "answer": answer})


def _check_template(template: str) -> None:
    try:
        render_prompt(template, question="q", answer="a", golds=["g"])
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"prompt_template may only use the fields {{question}}, {{gold}} and {{answer}} "
            f"(double other braces: {{{{ }}}}): {type(exc).__name__}: {exc}"
        ) from None


# --------------------------------------------------------------------------------------------------
# The reward
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JudgeVerdict:
    """One judgement. ``score`` is None when the judge gave none (then ``fallback`` is True)."""

    score: float | None
    raw: str
    fallback: bool
    error: str | None = None
    error_kind: ChatErrorKind | None = None

    def reward_info(self, fallback_score: float) -> dict[str, Any]:
        """The reward dict an env puts in ``info["reward_info"]``."""
        return {
            "reward": fallback_score if self.fallback or self.score is None else self.score,
            "judge_score": self.score,
            "judge_raw": self.raw,
            "judge_fallback": self.fallback,
            "judge_error": self.error,
            "judge_error_kind": self.error_kind.value if self.error_kind else None,
        }


def _golds(answer: Any) -> list[str]:
    if answer is None:
        return []
    if isinstance(answer, str):
        return [answer]
    try:
        return [str(a) for a in answer]
    except TypeError:
        return [str(answer)]


class JudgeReward:
    """Reward = an LLM judge's score of the episode's final answer against the gold answer(s).

    Args:
        base_url: the judge's OpenAI-compatible base URL, e.g. ``http://127.0.0.1:8000/v1``
            (``rlf-serve``, vLLM, or any hosted API).
        model: the judge model's name on that server.
        prompt_template: the user message, with ``{question}``, ``{gold}`` and ``{answer}``;
            default :data:`SCORE_TAG_PROMPT` (or :data:`YES_NO_PROMPT` for ``score_parser="yes_no"``).
        score_parser: ``"score_tag"`` (``<score>x</score>``, x in [0, 1]), ``"yes_no"``, or a
            callable ``str -> float | None`` (None: no score in the reply).
        max_concurrency: judge requests in flight at once (per event loop).
        timeout_s, retries, backoff_s, api_key: see :class:`OpenAIChatClient`.
        fallback_score: the reward when no verdict comes back (``judge_fallback: True``).
        max_tokens, temperature: sampling of the judge's reply.
        system_prompt: an optional system message before the prompt.
        answer_tag: the tag the episode's answer is in (the final response is used as the answer
            when a terminated episode has no such tag).

    Returns (awaited on an episode) ``{"reward", "judge_score", "judge_raw", "judge_fallback",
    "judge_error", "judge_error_kind"}``. An episode with no answer at all (truncated without
    one) is scored 0.0 without asking the judge.

    Example:
        >>> import asyncio
        >>> from rlf_envs.types import Episode, TaskInstance
        >>> judge = JudgeReward("http://127.0.0.1:8000/v1", "judge", score_parser="yes_no")
        >>> def ended(response, truncated=False):
        ...     return Episode(TaskInstance("0", "Capital of Zorvia?", "Leidax"), [], response, None, [],
        ...                    turns=1, terminated=not truncated, truncated=truncated)
        >>> asyncio.run(judge(ended("<answer>Leidax</answer>")))  # doctest: +SKIP
        {'reward': 1.0, 'judge_score': 1.0, 'judge_raw': 'Yes.', 'judge_fallback': False, ...}
        >>> info = asyncio.run(judge(ended("", truncated=True)))  # no answer: 0.0, the judge is not asked
        >>> info["reward"], info["judge_fallback"], info["judge_error"]
        (0.0, False, None)
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        prompt_template: str | None = None,
        score_parser: str | ScoreParser = "score_tag",
        max_concurrency: int = 16,
        timeout_s: float = 30.0,
        retries: int = 2,
        backoff_s: float = 0.5,
        fallback_score: float = 0.0,
        api_key: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        system_prompt: str | None = None,
        answer_tag: str = "answer",
    ) -> None:
        if isinstance(score_parser, str):
            if score_parser not in SCORE_PARSERS:
                raise ValueError(f"unknown score_parser {score_parser!r}; use one of {sorted(SCORE_PARSERS)} or a callable")  # fmt: skip
            self.score_parser: ScoreParser = SCORE_PARSERS[score_parser]
        elif callable(score_parser):
            self.score_parser = score_parser
        else:
            raise TypeError(f"score_parser must be a name or a callable, got {type(score_parser).__name__}")
        if prompt_template is None:
            prompt_template = YES_NO_PROMPT if score_parser == "yes_no" else SCORE_TAG_PROMPT
        _check_template(prompt_template)
        self.prompt_template = prompt_template
        self.fallback_score = float(fallback_score)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.answer_tag = answer_tag
        self.client = OpenAIChatClient(
            base_url, model, max_concurrency=max_concurrency, timeout_s=timeout_s, retries=retries,
            backoff_s=backoff_s, api_key=api_key,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"JudgeReward({self.client.base_url!r}, {self.client.model!r})"

    async def __call__(self, episode: Episode) -> dict[str, Any]:
        """Score one finished episode (the reward function a task calls)."""
        answer = episode_prediction(episode, self.answer_tag)
        if answer is None and episode.terminated:
            answer = episode.final_response.strip()  # answered in plain text, without the tag
        if not answer:
            return JudgeVerdict(0.0, "", fallback=False).reward_info(self.fallback_score)
        verdict = await self.judge(episode.instance.question, answer, _golds(episode.instance.answer))
        return verdict.reward_info(self.fallback_score)

    async def judge(self, question: str, answer: str, golds: Sequence[str] = ()) -> JudgeVerdict:
        """Ask the judge about one answer; never raises (failures are fallback verdicts)."""
        prompt = render_prompt(self.prompt_template, question=question, answer=answer, golds=golds)
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        try:
            completion = await self.client.complete(
                messages, max_tokens=self.max_tokens, temperature=self.temperature
            )
        except ChatCompletionError as exc:
            return JudgeVerdict(
                None, "", fallback=True, error=f"{exc.kind.value}: {exc}", error_kind=exc.kind
            )
        except Exception as exc:  # anything unforeseen still must not lose the batch
            return JudgeVerdict(None, "", fallback=True, error=f"{type(exc).__name__}: {exc}",
                                error_kind=ChatErrorKind.UNAVAILABLE)  # fmt: skip
        try:
            score = self.score_parser(completion.text)
            score = None if score is None else float(score)
        except Exception as exc:  # a user parser's bug is reported like an unparsable reply
            return JudgeVerdict(None, completion.text, fallback=True, error_kind=ChatErrorKind.UNPARSABLE,
                                error=f"unparsable: the score parser raised {type(exc).__name__}: {exc}")  # fmt: skip
        if score is None or math.isnan(score):
            return JudgeVerdict(None, completion.text, fallback=True, error_kind=ChatErrorKind.UNPARSABLE,
                                error=f"unparsable: no score in the judge's reply {completion.text[:200]!r}")  # fmt: skip
        return JudgeVerdict(score, completion.text, fallback=False)

    async def aclose(self) -> None:
        """Close the HTTP sessions (see :meth:`OpenAIChatClient.aclose`)."""
        await self.client.aclose()

    def close(self) -> None:
        """Close the HTTP sessions from synchronous code (see :meth:`OpenAIChatClient.close`)."""
        self.client.close()


__all__ = [
    "NO_REFERENCE",
    "SCORE_PARSERS",
    "SCORE_TAG_PROMPT",
    "YES_NO_PROMPT",
    "JudgeReward",
    "JudgeVerdict",
    "parse_score_tag",
    "parse_yes_no",
    "render_prompt",
]
