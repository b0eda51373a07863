"""The learning rules: GRPO-family losses and advantages, the GRPO update, SFT."""
