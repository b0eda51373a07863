"""Rule rewards: answer normalisation, exact match, token F1, containment and numeric equality.

Plain functions with no heavy dependencies, plus :data:`RULE_REWARDS`, a registry of episode
rewards that tasks and configs can name ("exact_match", "f1", "contains", "math").

Example:
    >>> exact_match("The Eiffel Tower!", ["eiffel tower"])
    1.0
    >>> round(f1_score("Kelmar river delta", "the Kelmar River"), 3)
    0.8
    >>> math_equal("\\\\boxed{\\\\frac{1}{2}}", "0.5")
    True
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from fractions import Fraction

from rlf_envs.answers import extract_answer
from rlf_envs.types import Episode

Golds = str | Sequence[str]
EpisodeReward = Callable[[Episode], dict[str, float]]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and articles, collapse whitespace.

    Example:
        >>> normalize_answer("  The  Kelmar-River. ")
        'kelmarriver'
    """
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _as_list(golds: Golds | None) -> list[str]:
    if golds is None:
        return []
    if isinstance(golds, str):
        return [golds]
    # parquet rows give numpy arrays; anything iterable of strings is accepted
    return [str(g) for g in golds]


def exact_match(pred: str | None, golds: Golds | None) -> float:
    """1.0 when the normalised prediction equals any normalised gold, else 0.0.

    Example:
        >>> exact_match("an apple", ["Apple", "pear"])
        1.0
    """
    if pred is None:
        return 0.0
    norm_pred = normalize_answer(pred)
    return float(any(norm_pred == normalize_answer(gold) for gold in _as_list(golds)))


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # SQuAD convention: two empty answers agree, one empty answer scores 0
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str | None, golds: Golds | None) -> float:
    """Token-level F1 between the normalised prediction and the best-matching gold.

    Example:
        >>> f1_score("Tarin Vosk", ["Vosk"])
        0.6666666666666666
    """
    if pred is None:
        return 0.0
    pred_tokens = normalize_answer(pred).split()
    return max((_token_f1(pred_tokens, normalize_answer(g).split()) for g in _as_list(golds)), default=0.0)


def contains_match(pred: str | None, golds: Golds | None) -> float:
    """1.0 when some normalised gold occurs in the normalised prediction as whole words.

    Whole words (not raw substrings) so that the gold "art" is not found in "party".

    Example:
        >>> contains_match("It is Zorvia, I think", ["zorvia"]), contains_match("party", ["art"])
        (1.0, 0.0)
    """
    if pred is None:
        return 0.0
    padded_pred = f" {normalize_answer(pred)} "
    for gold in _as_list(golds):
        norm_gold = normalize_answer(gold)
        if norm_gold and f" {norm_gold} " in padded_pred:
            return 1.0
    return 0.0


# --- numbers -----------------------------------------------------------------------------------

_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _clean_math(text: str) -> str:
    boxed = _last_boxed(text)
    if boxed is not None:
        text = boxed
    text = _TEXT.sub(r"\1", text)
    text = _FRAC.sub(r"(\1)/(\2)", text)
    for token in ("$", "\\left", "\\right", "\\!", "\\,", "\\;", " ", "{", "}"):
        text = text.replace(token, "")
    text = text.replace("\\%", "%").rstrip(".")
    return text


_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?$")


def _parse_number(text: str) -> Fraction | float | None:
    """A cleaned math string as a number: ``3``, ``-2.5``, ``1,000``, ``3/4``, ``(1)/(2)``, ``50%``."""
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    percent = text.endswith("%")
    if percent:
        text = text[:-1]
    fraction = re.fullmatch(rf"\(?({_NUMBER})\)?/\(?({_NUMBER})\)?", text)
    try:
        if fraction:
            denominator = Fraction(fraction.group(2))
            if denominator == 0:
                return None
            value: Fraction | float = Fraction(fraction.group(1)) / denominator
        elif re.fullmatch(_NUMBER, text):
            value = Fraction(text)
        else:
            return None
    except (ValueError, ZeroDivisionError):
        return None
    return value / 100 if percent else value


def _is_integer(value: Fraction | float) -> bool:
    return isinstance(value, Fraction) and value.denominator == 1


def math_equal(
    pred: str | None, gold: str | float | int, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> bool:
    """Whether two math answers are the same number (within tolerance), or the same cleaned string.

    Understands ints, decimals, thousands separators, ``a/b``, ``\\frac{a}{b}``, percentages
    and takes the last ``\\boxed{}`` if there is one.

    Example:
        >>> math_equal("$\\\\boxed{1,000}$", 1000), math_equal("1/3", "0.33"), math_equal("18272728", 18272727)
        (True, False, False)
    """
    if pred is None:
        return False
    clean_pred, clean_gold = _clean_math(str(pred)), _clean_math(str(gold))
    num_pred, num_gold = _parse_number(clean_pred), _parse_number(clean_gold)
    if num_pred is not None and num_gold is not None:
        if num_pred == num_gold:
            return True
        if _is_integer(num_pred) and _is_integer(num_gold):  # integers never match "approximately"
            return False
        return math.isclose(float(num_pred), float(num_gold), rel_tol=rel_tol, abs_tol=abs_tol)
    return clean_pred != "" and clean_pred == clean_gold


# --- episode rewards -----------------------------------------------------------------------------


def episode_prediction(episode: Episode, tag: str = "answer") -> str | None:
    """The answer an episode gave: ``final_answer``, else the last ``<tag>`` block of the final response."""
    if episode.final_answer is not None:
        return episode.final_answer
    return extract_answer(episode.final_response, tag)


def _episode_golds(episode: Episode) -> list[str]:
    return _as_list(episode.instance.answer)


def _qa_scores(episode: Episode) -> tuple[str | None, list[str], dict[str, float]]:
    pred, golds = episode_prediction(episode), _episode_golds(episode)
    return pred, golds, {"em": exact_match(pred, golds), "f1": f1_score(pred, golds)}


def exact_match_reward(episode: Episode) -> dict[str, float]:
    """Reward = exact match of the episode's answer; ``em`` and ``f1`` reported alongside."""
    _, _, scores = _qa_scores(episode)
    return {"reward": scores["em"], **scores}


def f1_reward(episode: Episode) -> dict[str, float]:
    """Reward = token F1 of the episode's answer (partial credit)."""
    _, _, scores = _qa_scores(episode)
    return {"reward": scores["f1"], **scores}


def contains_reward(episode: Episode) -> dict[str, float]:
    """Reward = whether a gold answer occurs (as whole words) in the episode's answer."""
    pred, golds, scores = _qa_scores(episode)
    contained = contains_match(pred, golds)
    return {"reward": contained, "contains": contained, **scores}


def math_reward(episode: Episode) -> dict[str, float]:
    """Reward = numeric equality of the episode's answer with any gold (see :func:`math_equal`)."""
    pred, golds, scores = _qa_scores(episode)
    correct = float(any(math_equal(pred, gold) for gold in golds))
    return {"reward": correct, **scores}


RULE_REWARDS: dict[str, EpisodeReward] = {
    "exact_match": exact_match_reward,
    "em": exact_match_reward,
    "f1": f1_reward,
    "contains": contains_reward,
    "math": math_reward,
}


def get_rule_reward(name: str) -> EpisodeReward:
    """Look a rule reward up by name, with an error that lists the known names."""
    try:
        return RULE_REWARDS[name]
    except KeyError:
        raise KeyError(f"unknown rule reward {name!r}; known: {sorted(RULE_REWARDS)}") from None


__all__ = [
    "RULE_REWARDS",
    "contains_match",
    "episode_prediction",
    "exact_match",
    "f1_score",
    "get_rule_reward",
    "math_equal",
    "normalize_answer",
]
