"""Test-only harnesses (fuzzing, identity sweeps, Triton compilation, CUDA launch limits, vLLM end to end):
run from the repository root, e.g. ``python -m tests.harness.fuzz``; nothing in the library imports them."""
