"""The processes and the run's state: launch and collectives, rank watch, checkpoints, the LR schedule."""
