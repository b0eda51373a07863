"""Adapters that let other trainers drive RLF envs (they import those trainers only when called)."""
