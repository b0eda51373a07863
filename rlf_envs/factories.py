"""The entry points behind every registered id: build the id's task from kwargs, then the env.

Each id in :data:`envs_registry.ENV_IDS` names a task builder (``"module:attr"``: a task class or a
function returning a task) and, optionally, a function returning default kwargs for it. Keyword
arguments that the builder accepts configure the task; the rest configure the env (``split``,
``parser``, ``max_result_chars``, ``autoreset_mode``, ...).

Example:
    >>> env = make_env(task_entry=TOOL_USE, tasks=[{"question": "Say hi", "answer": "hi"}], reward="exact_match")
    >>> env.reset(seed=0)[0]
    'Say hi'
    >>> env.close()
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from envs_registry import TOOL_USE
from rlf_envs.core.env import ToolEnv
from rlf_envs.core.task import Task
from rlf_envs.core.vector import ToolVectorEnv

__all__ = ["TOOL_USE", "build_task", "make_env", "make_vec"]


def _load(ref: str) -> Any:
    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def build_task(task_entry: str, kwargs: dict[str, Any], task_defaults: str | None = None) -> Task:
    """The task of ``task_entry`` built from the kwargs it accepts; those are popped from ``kwargs``.

    ``task_defaults`` (``"module:function"``) returns kwargs that the caller's override.
    """
    builder = _load(task_entry)
    if task_defaults is not None:
        kwargs.update({**_load(task_defaults)(), **kwargs})
    params = inspect.signature(builder).parameters
    return builder(**{name: kwargs.pop(name) for name in list(kwargs) if name in params})


def make_env(*, task_entry: str, task_defaults: str | None = None, **kwargs: Any) -> ToolEnv:
    """A :class:`ToolEnv` of the task ``task_entry`` builds (``gym.make`` passes the id's entries)."""
    return ToolEnv(build_task(task_entry, kwargs, task_defaults), **kwargs)


def make_vec(
    num_envs: int = 1, *, task_entry: str, task_defaults: str | None = None, **kwargs: Any
) -> ToolVectorEnv:
    """A :class:`ToolVectorEnv` of ``num_envs`` episodes (``gym.make_vec`` passes the id's entries)."""
    return ToolVectorEnv(build_task(task_entry, kwargs, task_defaults), num_envs, **kwargs)
