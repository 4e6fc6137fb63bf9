"""A run around the steps: its state and checkpoints, set-up and finish, checks before any work, resume,
per-step accounting, evaluation and the held-out split, the equivalence check, intervals, plots and
provenance."""
