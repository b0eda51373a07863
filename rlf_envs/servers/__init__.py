"""MCP servers shipped with RLF, each runnable as ``python -m rlf_envs.servers.<name>``."""
