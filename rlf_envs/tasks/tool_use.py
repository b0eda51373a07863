"""RLF/ToolUse-v0: MCP servers + a task list + a reward, and no env class to write.

Tasks come as a list of dicts or a JSONL / JSON / parquet file; each has ``question`` (or
``prompt``) and optionally ``answer`` (or ``golden_answers``) and ``id``. The reward is a callable
``reward(episode) -> float | dict`` (sync or async) or the name of a registered rule reward.

Example:
    >>> task = make_tool_use_task(tasks=[{"question": "1+1?", "answer": "2"}], reward="exact_match")
    >>> task.instances("train")[0].answer
    '2'
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlf_envs.core.task import FunctionTask
from rlf_envs.types import RewardFn, TaskInstance

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant that can call tools. Think step by step, call tools when they help, "
    "and give your final answer inside <answer> and </answer>."
)


def _read_records(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ImportError("reading parquet tasks needs pyarrow: pip install 'rlf[data]'") from exc
        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if suffix == ".json":
        data = json.loads(text)
        return data if isinstance(data, list) else data.get("tasks", [])
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def to_instance(record: dict[str, Any], index: int) -> TaskInstance:
    """A task record (dict) as a :class:`TaskInstance`; raises ValueError naming what is missing."""
    question = record.get("question", record.get("prompt"))
    if not isinstance(question, str):
        raise ValueError(f"task {index} needs a string 'question' (or 'prompt'), got keys {sorted(record)}")
    answer = record.get("answer", record.get("golden_answers", record.get("answers")))
    known = {"question", "prompt", "answer", "golden_answers", "answers", "id"}
    metadata = {k: v for k, v in record.items() if k not in known}
    return TaskInstance(id=str(record.get("id", index)), question=question, answer=answer, metadata=metadata)


def load_tasks(tasks: Sequence[dict[str, Any]] | str | os.PathLike[str]) -> list[TaskInstance]:
    """Task instances from a list of dicts or a JSONL / JSON / parquet path."""
    records = _read_records(Path(tasks)) if isinstance(tasks, str | os.PathLike) else list(tasks)
    return [to_instance(record, i) for i, record in enumerate(records)]


def resolve_reward_fn(reward: RewardFn | str) -> RewardFn:
    """A reward callable, or a registered rule reward looked up by name."""
    if callable(reward):
        return reward
    from rlf_envs.rewards.rules import RULE_REWARDS

    try:
        return RULE_REWARDS[reward]
    except KeyError:
        raise ValueError(f"unknown reward {reward!r}; registered: {sorted(RULE_REWARDS)}") from None


def make_tool_use_task(
    *,
    tasks: Sequence[dict[str, Any]] | str | os.PathLike[str],
    reward: RewardFn | str = "exact_match",
    test_tasks: Sequence[dict[str, Any]] | str | os.PathLike[str] | None = None,
    mcp_servers: dict[str, Any] | str | os.PathLike[str] | None = None,
    python_tools: Sequence[Callable[..., Any]] = (),
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    max_turns: int = 4,
    name: str = "tool_use",
    tool_success_reward: float = 0.0,
) -> FunctionTask:
    """Assemble a task from user data; ``test_tasks`` defaults to the training tasks.

    ``tool_success_reward``: the step reward of each tool turn whose calls all succeed (a small
    process reward, e.g. 0.1; see :attr:`rlf_envs.core.task.Task.tool_success_reward`).
    """
    splits = {"train": load_tasks(tasks)}
    if test_tasks is not None:
        splits["test"] = load_tasks(test_tasks)
    return FunctionTask(
        name,
        splits,
        resolve_reward_fn(reward),
        system_prompt=system_prompt,
        max_turns=max_turns,
        mcp_servers=mcp_servers,  # type: ignore[arg-type]
        python_tools=python_tools,
        tool_success_reward=tool_success_reward,
    )
