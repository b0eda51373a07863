"""Scripts run *inside* a peer's own venv (``.venv-peers/<peer>/bin/python <script> '<job json>'``).

They import only the peer and the standard library (never ``rlf_envs``), read one JSON job
(``server``, ``num_envs``, ``steps``, ``latency_ms``, ...) from argv or stdin, run the benchmark's
workload through the peer's own env and MCP tool machinery, and print one JSON line of figures.
"""
