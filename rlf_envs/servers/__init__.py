"""The generic MCP servers we ship, each runnable as ``python -m rlf_envs.servers.<name>``.

``latency`` (a tool that sleeps: benchmarks and tests), ``agent`` (another model or agent behind
an OpenAI-compatible endpoint, as a tool) and ``launch`` (the flags and stdio entries every server
uses). A task's own server lives in its task folder, e.g. ``rlf_envs.tasks.deepsearch.server``.
"""
