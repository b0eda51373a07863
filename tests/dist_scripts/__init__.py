"""Programs that tests/test_distributed.py starts under torchrun / accelerate launch (one per process)."""
