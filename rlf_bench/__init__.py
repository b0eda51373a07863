"""Benchmarks, run as ``rlf-bench env ...`` (and ``rlf-bench train ...`` with the trainer installed)."""
