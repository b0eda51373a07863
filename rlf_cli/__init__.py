"""Console entry points that span both halves (neither rlf_envs nor rlf_trainer imports the other)."""
