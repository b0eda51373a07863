"""Test-only MCP servers and helpers for spawning them (see faulty_server.py)."""
