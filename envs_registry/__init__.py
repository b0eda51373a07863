"""Registers every RLF env id with Gymnasium.

Gymnasium 1.x has no plugin entry points, so registration runs when this module is imported:
``import rlf_envs`` does it, and ``gym.make("envs_registry:RLF/DeepSearch-v0")`` imports this
module by itself. Entry points are strings, so nothing heavy is imported here.

Example:
    >>> import gymnasium as gym
    >>> register_envs()
    >>> "RLF/DeepSearch-v0" in gym.registry
    True
"""

from __future__ import annotations

import gymnasium as gym

ENV_IDS: dict[str, tuple[str, str]] = {
    "RLF/DeepSearch-v0": ("rlf_envs.factories:make_deepsearch_env", "rlf_envs.factories:make_deepsearch_vec"),
    "RLF/ToolUse-v0": ("rlf_envs.factories:make_tool_use_env", "rlf_envs.factories:make_tool_use_vec"),
    "RLF/SQL-v0": ("rlf_envs.factories:make_sql_env", "rlf_envs.factories:make_sql_vec"),
    "RLF/PythonTool-v0": ("rlf_envs.factories:make_python_tool_env", "rlf_envs.factories:make_python_tool_vec"),
    "RLF/Codebook-v0": ("rlf_envs.factories:make_codebook_env", "rlf_envs.factories:make_codebook_vec"),
    "RLF/CustomerService-v0": (
        "rlf_envs.factories:make_customer_service_env",
        "rlf_envs.factories:make_customer_service_vec",
    ),
}


def register_envs() -> None:
    """Register the ids that are not registered yet (safe to call any number of times)."""
    for env_id, (entry_point, vector_entry_point) in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, vector_entry_point=vector_entry_point)


register_envs()
