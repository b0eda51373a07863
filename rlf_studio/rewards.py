"""The Reward tab's backend: a reward spec (built-ins, weights, judge, a python file) as a callable.

A spec is plain JSON, saved as the project's ``reward.json``::

    {"components": [{"name": "exact_match", "weight": 0.9}, {"name": "format", "weight": 0.1}],
     "judge": {"base_url": "http://127.0.0.1:8000/v1", "model": "judge", "prompt_template": null},
     "python": {"file": "/path/my_reward.py", "function": "reward"}, "sql": {"seed": 0}}

Built-ins: the env's rule rewards (``exact_match``, ``f1``, ``contains``, ``math``), ``format``
(1 when the answer sits in ``<answer>`` tags), ``sql`` (execution match: the answer's query and
the gold query return the same rows on the generated database of ``RLF/SQL-v0``, the one the
bundled sqlite server serves), ``judge`` (:class:`rlf_envs.rewards.judge.JudgeReward`)
and ``python`` (the user's function; the only user code the studio ever runs). The composed
reward is the weighted sum of the components' ``reward`` values; each component's value is
reported under its name.

Example:
    >>> import asyncio
    >>> spec = {"components": [{"name": "exact_match", "weight": 0.9}, {"name": "format", "weight": 0.1}]}
    >>> reward = build_reward(spec)
    >>> asyncio.run(reward(sample_episode("Capital of France?", "Paris", "<answer>paris</answer>")))["reward"]
    1.0
    >>> asyncio.run(reward(sample_episode("Capital of France?", "Paris", "Lyon")))["reward"]
    0.0
    >>> build_reward({"components": [{"name": "nope", "weight": 1}]})
    Traceback (most recent call last):
    ...
    rlf_studio.rewards.RewardSpecError: unknown reward 'nope'; built-ins: contains, exact_match, f1, format, judge, math, python, sql
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlf_envs.answers import extract_answer
from rlf_envs.core.task import resolve_reward
from rlf_envs.rewards.judge import JudgeReward
from rlf_envs.rewards.rules import RULE_REWARDS
from rlf_envs.types import Episode, TaskInstance

RULES = ("exact_match", "f1", "contains", "math")
BUILTINS = (*RULES, "format", "sql", "judge", "python")


class RewardSpecError(ValueError):
    """The reward spec is incomplete or names something unknown; or the python file cannot load."""


def format_reward(episode: Episode) -> dict[str, float]:
    """1.0 when the episode's final response carries an ``<answer>...</answer>`` tag."""
    tagged = extract_answer(episode.final_response) is not None or episode.final_answer is not None
    return {"reward": float(tagged)}


def load_python_reward(file: str | Path, function: str) -> Callable[..., Any]:
    """Import ``function`` from the user's python ``file`` (this runs the file's top level)."""
    if not str(file or "").strip():
        raise RewardSpecError("the python reward needs a file: type the path of a .py file")
    path = Path(file).expanduser()
    if not path.exists():
        raise RewardSpecError(f"the reward file {str(path)!r} does not exist")
    if not path.is_file() or path.suffix != ".py":
        raise RewardSpecError(f"the reward file {str(path)!r} is not a .py file")
    module_name = f"rlf_studio_user_reward_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise RewardSpecError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise RewardSpecError(f"importing {path.name} raised {type(exc).__name__}: {exc}") from exc
    sys.modules[module_name] = module
    fn = getattr(module, function or "", None)
    if not callable(fn):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardSpecError(
            f"{path.name} has no function {function!r}; it has: {', '.join(names) or 'none'}"
        )
    return fn


def _component(spec: dict[str, Any], name: str) -> Callable[..., Any]:
    if name in RULES:
        return RULE_REWARDS[name]
    if name == "format":
        return format_reward
    if name == "judge":
        judge = spec.get("judge") or {}
        if not judge.get("base_url") or not judge.get("model"):
            raise RewardSpecError("the judge reward needs an endpoint URL and a model name")
        return JudgeReward(
            judge["base_url"], judge["model"], prompt_template=judge.get("prompt_template") or None,
            score_parser=judge.get("score_parser") or "score_tag",
        )  # fmt: skip
    if name == "sql":
        from rlf_envs.tasks.sql.task import SQLTask

        seed = int((spec.get("sql") or {}).get("seed", 0))
        return SQLTask(seed=seed, isolation="guards").reward  # the reward runs in-process either way
    if name == "python":
        python = spec.get("python") or {}
        return load_python_reward(python.get("file", ""), python.get("function", "reward"))
    raise RewardSpecError(f"unknown reward {name!r}; built-ins: {', '.join(sorted(BUILTINS))}")


def _value(raw: Any, name: str) -> float:
    value = raw.get("reward") if isinstance(raw, dict) else raw
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RewardSpecError(
            f"the {name} reward returned {raw!r}; it must be a number or {{'reward': number}}"
        )
    return float(value)


def check_spec(spec: dict[str, Any]) -> list[tuple[str, float]]:
    """The (name, weight) components of a spec; :class:`RewardSpecError` when there is none or a weight is bad."""
    parts = []
    for item in spec.get("components") or []:
        name = str(item.get("name", ""))
        try:
            weight = float(item.get("weight", 1.0))
        except (TypeError, ValueError):
            raise RewardSpecError(
                f"the weight of {name!r} must be a number, got {item.get('weight')!r}"
            ) from None
        if weight != 0:
            parts.append((name, weight))
    if not parts:
        raise RewardSpecError("pick at least one reward with a non-zero weight")
    return parts


def build_reward(spec: dict[str, Any]) -> Callable[[Episode], Any]:
    """The composed async reward of ``spec`` (components are built now, so errors surface now)."""
    parts = [(name, weight, _component(spec, name)) for name, weight in check_spec(spec)]

    async def composed(episode: Episode) -> dict[str, Any]:
        info: dict[str, Any] = {}
        total = 0.0
        for name, weight, fn in parts:
            raw = await resolve_reward(fn, episode)
            value = _value(raw, name)
            if isinstance(raw, dict):
                info.update({k: v for k, v in raw.items() if k != "reward" and isinstance(v, int | float)})
            info[name] = value
            total += weight * value
        return {"reward": total, **info}

    return composed


def sample_episode(question: str, gold: Any, response: str) -> Episode:
    """A one-turn episode that answered ``response``, for previews."""
    return Episode(
        instance=TaskInstance(id="preview", question=question, answer=gold),
        messages=[{"role": "user", "content": question}, {"role": "assistant", "content": response}],
        final_response=response,
        final_answer=extract_answer(response),
        tool_calls=[],
        turns=1,
        terminated=True,
        truncated=False,
    )


def load_spec(path: Path) -> dict[str, Any]:
    """A saved spec, or the default (exact match) when there is none."""
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return {"components": [{"name": "exact_match", "weight": 1.0}]}


def load_project_reward(project_dir: str | Path) -> Callable[[Episode], Any]:
    """The reward of a project folder's ``reward.json`` (what a studio-made config imports)."""
    path = Path(project_dir) / "reward.json"
    if not path.is_file():
        raise RewardSpecError(f"{path} does not exist: save a reward in the Reward tab first")
    return build_reward(load_spec(path))


def parse_gold(text: Any) -> Any:
    """A gold answer typed in a table cell: a JSON list stays a list, anything else is text.

    Example:
        >>> parse_gold('["Paris", "paris, france"]'), parse_gold("Paris")
        (['Paris', 'paris, france'], 'Paris')
    """
    if isinstance(text, str) and text.strip().startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text
        return [str(v) for v in value] if isinstance(value, list) else text
    return text


def preview(spec: dict[str, Any], samples: list[list[Any]]) -> tuple[list[list[Any]], list[str]]:
    """Score each (question, gold, response) sample: (table rows, error messages).

    Example:
        >>> rows, errors = preview({"components": [{"name": "f1", "weight": 1}]}, [["Q?", "Kelmar river", "<answer>Kelmar</answer>"]])
        >>> rows[0][3], errors
        (0.667, [])
    """
    import asyncio

    reward = build_reward(spec)
    rows, errors = [], []
    for number, sample in enumerate(samples, 1):
        question, gold, response = (list(sample) + ["", "", ""])[:3]
        if not str(question or "").strip() and not str(response or "").strip():
            continue
        episode = sample_episode(str(question or ""), parse_gold(gold), str(response or ""))
        try:
            info = asyncio.run(reward(episode))
        except Exception as exc:
            message = f"sample {number}: the reward raised {type(exc).__name__}: {exc}"
            errors.append(message)
            rows.append([question, gold, response, None, message])
            continue
        details = ", ".join(
            f"{k}={v:.3g}" for k, v in info.items() if k != "reward" and isinstance(v, int | float)
        )
        rows.append([question, gold, response, round(float(info["reward"]), 3), details])
    return rows, errors
