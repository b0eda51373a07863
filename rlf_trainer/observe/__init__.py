"""What a run shows about itself: metrics, health checks, the token budget, progress, evaluation (pass@k)."""
