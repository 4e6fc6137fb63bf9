"""Kernel microbenchmarks (run from the repository root: python -m benchmarks.bench_chain --help)."""
