"""Measurements built on the loop (each a ``python -m rl_loop.experiments.<name>`` script): rollout speed
by k, tree shape, verification method and decode path, drafter acceptance, the GPU rollout figure, the
default run repeated over seeds, and AR vs speculative training over seeds."""
