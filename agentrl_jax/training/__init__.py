"""The training system: rollouts, SFT and RL trainers, checkpoints and metrics."""
