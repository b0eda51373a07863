"""Codebook: a tiny bundled tool task (look a word's secret code up, then answer it).

Example:
    >>> from rlf_envs.tasks.codebook import TRAIN_TASKS, lookup
    >>> lookup(TRAIN_TASKS[0]["word"]) == TRAIN_TASKS[0]["answer"]
    True
"""

from rlf_envs.tasks.codebook.data import (
    CALL_HINT,
    DEFAULT_SEED,
    EXAMPLE_CODE,
    EXAMPLE_WORD,
    WORDS,
    make_codebook,
    make_task_records,
)
from rlf_envs.tasks.codebook.task import (
    CODEBOOK,
    SYSTEM_PROMPT,
    TEST_TASKS,
    TOOL_NAME,
    TRAIN_TASKS,
    codebook_reward,
    lookup,
    stated_answer,
    states_code,
    tool_use_kwargs,
)

__all__ = [
    "CALL_HINT",
    "CODEBOOK",
    "DEFAULT_SEED",
    "EXAMPLE_CODE",
    "EXAMPLE_WORD",
    "SYSTEM_PROMPT",
    "TEST_TASKS",
    "TOOL_NAME",
    "TRAIN_TASKS",
    "WORDS",
    "codebook_reward",
    "lookup",
    "make_codebook",
    "make_task_records",
    "stated_answer",
    "states_code",
    "tool_use_kwargs",
]
