"""`replaytests rollouts`: the trainer's recompute of rollouts users bring (docs/rollouts.md)."""
