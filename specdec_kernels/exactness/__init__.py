"""The exactness suite's building blocks: laws of chain / block / traversal verification on toy Markov models,
the planted-bug mutants that show the checks' power, goodness-of-fit tests under one false-positive budget,
exact (enumerated) acceptance theory, hostile inputs, and the CUDA host emulation. The audit
(:mod:`specdec_kernels.audit`) and the tests run them."""
