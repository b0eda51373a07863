"""Playing episodes: chat token assembly, trajectories, lockstep and async rollouts (token ids), the text
rollout of an endpoint, a step's collection."""
