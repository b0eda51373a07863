"""rlf_envs: tool-use tasks as text Gymnasium environments.

Importing the package registers the env ids with Gymnasium.

Example:
    >>> import gymnasium as gym, rlf_envs
    >>> envs = gym.make_vec("RLF/DeepSearch-v0", num_envs=8)   # doctest: +SKIP
"""

from envs_registry import ENV_IDS, register_envs

register_envs()

__all__ = ["ENV_IDS", "register_envs"]
__version__ = "0.1.0"
