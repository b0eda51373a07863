"""The env contract: task, episode, env runtime, the single env and the vector env."""
