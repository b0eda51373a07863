"""Registers every RLF env id with Gymnasium.

Gymnasium 1.x has no plugin entry points, so registration runs when this module is imported:
``import rlf_envs`` does it, and ``gym.make("envs_registry:RLF/DeepSearch-v0")`` imports this
module by itself. Every id has the same two entry points (:func:`rlf_envs.factories.make_env`
and ``make_vec``); its spec kwargs name the task to build. Entry points and tasks are strings,
so nothing heavy is imported here.

Example:
    >>> import gymnasium as gym
    >>> register_envs()
    >>> gym.spec("RLF/SQL-v0").kwargs
    {'task_entry': 'rlf_envs.tasks.sql.task:SQLTask'}
"""

from __future__ import annotations

import gymnasium as gym

ENTRY_POINT = "rlf_envs.factories:make_env"
VECTOR_ENTRY_POINT = "rlf_envs.factories:make_vec"
TOOL_USE = "rlf_envs.tasks.tool_use:make_tool_use_task"

# Each id's spec kwargs: the task builder ("module:attr", a Task class or a function) and, for an
# id that is another with preset kwargs, the function that returns them.
ENV_IDS: dict[str, dict[str, str]] = {
    "RLF/DeepSearch-v0": {"task_entry": "rlf_envs.tasks.deepsearch.task:DeepSearchTask"},
    "RLF/ToolUse-v0": {"task_entry": TOOL_USE},
    "RLF/SQL-v0": {"task_entry": "rlf_envs.tasks.sql.task:SQLTask"},
    "RLF/PythonTool-v0": {"task_entry": "rlf_envs.tasks.python_tool.task:PythonToolTask"},
    # RLF/ToolUse-v0 with the codebook's questions, tool, reward and system prompt (all overridable)
    "RLF/Codebook-v0": {
        "task_entry": TOOL_USE,
        "task_defaults": "rlf_envs.tasks.codebook.task:tool_use_kwargs",
    },
    "RLF/CustomerService-v0": {"task_entry": "rlf_envs.tasks.customer_service.task:CustomerServiceTask"},
}


def register_envs() -> None:
    """Register the ids that are not registered yet (safe to call any number of times)."""
    for env_id, spec_kwargs in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point=ENTRY_POINT,
                vector_entry_point=VECTOR_ENTRY_POINT,
                kwargs=dict(spec_kwargs),
            )


register_envs()
