"""rlf_envs: tool-use tasks as text Gymnasium environments.

Importing the package registers the env ids with Gymnasium.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> sorted(rlf_envs.ENV_IDS)
    ['RLF/Codebook-v0', 'RLF/CustomerService-v0', 'RLF/DeepSearch-v0', 'RLF/PythonTool-v0', 'RLF/SQL-v0', 'RLF/ToolUse-v0']
    >>> envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=8)
    >>> prompts, infos = envs.reset(seed=0)
    >>> len(prompts)
    8
    >>> envs.close()
"""

from envs_registry import ENV_IDS, register_envs

register_envs()

__all__ = ["ENV_IDS", "register_envs"]
__version__ = "0.1.0"
