"""Playing episodes: chat token assembly, trajectories, lockstep and async rollouts, a step's collection."""
