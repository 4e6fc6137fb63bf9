"""Smoke tests of benchmarks/bench_block_traversal.py on tiny configurations (CSV / markdown with provenance)."""

from __future__ import annotations

import json

import pytest
import torch

import specdec_kernels as sk
from benchmarks import bench_block_traversal
from benchmarks.bench_chain import ChainCase, make_inputs
from benchmarks.common import BASE_COLUMNS, read_csv
from specdec_kernels import native


@pytest.mark.skipif(not native.has_op("verify_chain_block", "cpu"), reason="specdec_kernels._C not built")
def test_cost_writes_both_methods_with_provenance(tmp_path):
    out = tmp_path / "cost.csv"
    bench_block_traversal.main(["cost", "--batch", "2", "--k", "2", "--vocab", "300", "--rounds", "2", "--repeats", "1",
                        "--out", str(out)])
    rows = read_csv([out])
    assert set(BASE_COLUMNS) | set(bench_block_traversal.COST_COLUMNS) <= set(rows[0])
    assert sorted((r["op"], r["method"]) for r in rows) == [
        ("chain", "block"), ("chain", "token"), ("tree-w2d2", "token"), ("tree-w2d2", "traversal")]
    assert all(float(r["lo_ms"]) <= float(r["median_ms"]) <= float(r["hi_ms"]) and r["git_commit"] for r in rows)


def test_acceptance_table_and_conditional_expectations(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_block_traversal, "ACCEPTANCE_SHAPES", {
        "chain k=2": bench_block_traversal.ACCEPTANCE_SHAPES["chain k=2"],
        "width 2, depth 1": bench_block_traversal.ACCEPTANCE_SHAPES["width 2, depth 1"],
    })
    stem = tmp_path / "acc"
    bench_block_traversal.main(["acceptance", "--toys", "1", "--requests", "64", "--vocab", "50", "--k", "2",
                        "--out", str(stem)])
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["provenance"]["command"].startswith("python -m benchmarks.bench_block_traversal acceptance")
    chain = data["toys"][0]
    assert chain["token"] <= chain["block"] <= chain["coupling"] + 1e-9
    assert "| chain k=2 | iid |" in stem.with_suffix(".md").read_text()
    # Given the drafts, both expectations lie in [0, k] and block's is at least token level's on average.
    inputs = make_inputs(ChainCase(256, 3, 40, "float32", "random", "stochastic"), torch.device("cpu"))
    exact = bench_block_traversal.conditional_accepted(inputs)
    assert all(bool(((v >= 0) & (v <= 3 + 1e-9)).all()) for v in exact.values())
    assert float(exact["block"].mean()) > float(exact["token"].mean())


def test_conditional_expectation_matches_the_measured_means():
    """The draft-conditional expectation (coins integrated out) is what the verifiers' accepted counts average
    to on the same drafts: measured means within 4.5 standard errors, for token level and block."""
    inputs = make_inputs(ChainCase(4096, 3, 40, "float32", "random", "stochastic"), torch.device("cpu"))
    exact = bench_block_traversal.conditional_accepted(inputs)
    for method in ("token", "block"):
        got = sk.verify_chain(**inputs.api_kwargs(), backend="reference", method=method).num_accepted.double()
        diff = got - exact[method]
        assert abs(float(diff.mean())) < 4.5 * float(diff.std()) / len(diff) ** 0.5, method
