"""Entry points behind the registered ids: build a task from kwargs, then the single or vector env.

Keyword arguments that the task's constructor accepts configure the task; the rest configure the
env (``split``, ``parser``, ``max_result_chars``, ``autoreset_mode``, ...).

Example:
    >>> env = make_tool_use_env(tasks=[{"question": "Say hi", "answer": "hi"}], reward="exact_match")
    >>> env.reset(seed=0)[0]
    'Say hi'
    >>> env.close()
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from rlf_envs.env import ToolEnv
from rlf_envs.task import Task
from rlf_envs.tasks.tool_use import make_tool_use_task
from rlf_envs.vector import ToolVectorEnv


def _take_params(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    return {name: kwargs.pop(name) for name in list(kwargs) if name in params}


def _task(ref: str, kwargs: dict[str, Any]) -> Task:
    """Build the task class at ``"module:Class"`` from the kwargs its constructor accepts."""
    module_name, class_name = ref.split(":")
    task_cls = getattr(importlib.import_module(module_name), class_name)
    return task_cls(**_take_params(task_cls.__init__, kwargs))


DEEPSEARCH = "rlf_envs.tasks.deepsearch.task:DeepSearchTask"
SQL = "rlf_envs.tasks.sql.task:SQLTask"
PYTHON_TOOL = "rlf_envs.tasks.python_tool.task:PythonToolTask"
CUSTOMER_SERVICE = "rlf_envs.tasks.customer_service.task:CustomerServiceTask"


def make_deepsearch_env(**kwargs: Any) -> ToolEnv:
    """``RLF/DeepSearch-v0``: multi-turn search QA over the embedded world (or your corpus)."""
    return ToolEnv(_task(DEEPSEARCH, kwargs), **kwargs)


def make_deepsearch_vec(num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
    return ToolVectorEnv(_task(DEEPSEARCH, kwargs), num_envs, **kwargs)


def make_sql_env(**kwargs: Any) -> ToolEnv:
    """``RLF/SQL-v0``: text-to-SQL over a bundled sqlite database, scored by executing the query."""
    return ToolEnv(_task(SQL, kwargs), **kwargs)


def make_sql_vec(num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
    return ToolVectorEnv(_task(SQL, kwargs), num_envs, **kwargs)


def make_python_tool_env(**kwargs: Any) -> ToolEnv:
    """``RLF/PythonTool-v0``: generated math problems with a sandboxed python tool."""
    return ToolEnv(_task(PYTHON_TOOL, kwargs), **kwargs)


def make_python_tool_vec(num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
    return ToolVectorEnv(_task(PYTHON_TOOL, kwargs), num_envs, **kwargs)


def make_customer_service_env(**kwargs: Any) -> ToolEnv:
    """``RLF/CustomerService-v0``: a shop agent with tools, a simulated customer and a goal-state reward."""
    return ToolEnv(_task(CUSTOMER_SERVICE, kwargs), **kwargs)


def make_customer_service_vec(num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
    return ToolVectorEnv(_task(CUSTOMER_SERVICE, kwargs), num_envs, **kwargs)


def _codebook_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    from rlf_envs.tasks.codebook.task import tool_use_kwargs

    return {**tool_use_kwargs(), **kwargs}


def make_codebook_env(**kwargs: Any) -> ToolEnv:
    """``RLF/Codebook-v0``: look a word's code up with the ``lookup`` tool, then say it (a tiny learnable task).

    It is ``RLF/ToolUse-v0`` with the codebook's questions, tool, reward and system prompt
    (:func:`rlf_envs.tasks.codebook.tool_use_kwargs`); any of them can still be overridden.
    """
    return make_tool_use_env(**_codebook_kwargs(kwargs))


def make_codebook_vec(num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
    return make_tool_use_vec(num_envs, **_codebook_kwargs(kwargs))


def make_tool_use_env(**kwargs: Any) -> ToolEnv:
    """``RLF/ToolUse-v0``: your MCP servers, task list and reward (see :mod:`rlf_envs.tasks.tool_use`)."""
    return ToolEnv(make_tool_use_task(**_take_params(make_tool_use_task, kwargs)), **kwargs)


def make_tool_use_vec(num_envs: int = 1, **kwargs: Any) -> ToolVectorEnv:
    return ToolVectorEnv(make_tool_use_task(**_take_params(make_tool_use_task, kwargs)), num_envs, **kwargs)
