"""Smoke test of the benchmark harness on a tiny configuration (reference + vLLM V1 providers)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import specdec_kernels as sk
from benchmarks import bench_chain, call_overhead, overlap_probe, roofline, stream_compute_probe
from benchmarks.common import BASE_COLUMNS, PROVENANCE_COLUMNS, CsvWriter, read_csv
from specdec_kernels import native
from tests.conftest import REPO
from tests.docs.test_docs import as_run_today

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.slow
def test_bench_chain_writes_csv_with_provenance(tmp_path):
    providers = ["reference", "triton"] + (["vllm_v1"] if HAS_VLLM else [])
    out = tmp_path / "chain.csv"
    bench_chain.main([
        "--batch", "2", "--k", "2", "--vocab", "100", "--dtype", "float32",
        "--sampling", "greedy,random", "--drafts", "deterministic,stochastic",
        "--providers", ",".join(providers), "--device", "cpu", "--warmup", "0", "--repeats", "2", "--copy-mib", "8",
        "--out", str(out),
    ])
    rows = read_csv([out])
    columns = set(rows[0])
    assert set(BASE_COLUMNS) <= columns
    assert set(bench_chain.CASE_COLUMNS + bench_chain.RESULT_COLUMNS) <= columns
    # greedy x stochastic is folded into greedy x deterministic: 3 cases per provider
    assert len(rows) == 3 * len(providers)
    for row in rows:
        assert all(row[c] for c in ("device", "torch", "date_utc")), row
        assert row["provider"] in providers
        if row["provider"] == "triton":
            assert row["status"].startswith("skipped"), row  # CPU: no interpreter benchmarks
            continue
        assert row["status"] == "ok", row
        assert float(row["median_ms"]) > 0 and float(row["min_ms"]) <= float(row["median_ms"])
        assert int(row["min_bytes"]) <= int(row["all_rows_bytes"])
        assert float(row["roofline_fraction"]) > 0
    assert {PROVENANCE_COLUMNS[0], "git_commit"} <= columns


def test_chain_min_bytes_counts_decided_rows():
    lengths = torch.tensor([3, 0, 2])
    accepted = torch.tensor([1, 0, 2])  # decided rows: 2, 1, 3 (all accepted: bonus row too)
    small = 5 * 8 + 3 * (3 + 2) * 4
    assert roofline.chain_min_bytes(accepted, lengths, 10, 2, None) == 6 * 10 * 2 + small
    # draft-probability rows: 2, 0, 2 (the bonus row has none)
    assert roofline.chain_min_bytes(accepted, lengths, 10, 2, 4) == 6 * 10 * 2 + 4 * 10 * 4 + small
    assert roofline.chain_all_rows_bytes(lengths, 10, 2, 4) == 8 * 10 * 2 + 5 * 10 * 4 + small
    assert roofline.achieved_fraction(10**9, 1000.0, 2.0) == pytest.approx(0.5)


def _check_rounds(row: dict, rounds: str) -> None:
    assert row["status"] == "ok", row
    assert row["rounds"] == rounds and float(row["min_ms"]) <= float(row["median_ms"]) <= float(row["max_ms"]), row
    assert float(row["vs_torch_min"]) <= float(row["vs_torch"]) <= float(row["vs_torch_max"]), row


@pytest.mark.skipif(not native.has_op("decoder_step", "cpu"), reason="specdec_kernels._C not built")
def test_bench_decoder_step_writes_interleaved_rounds_with_command(tmp_path):
    from benchmarks import bench_decoder_step

    out = tmp_path / "step.csv"
    argv = ["--heads", "rl_loop", "--requests", "4", "--new-tokens", "1,3", "--context", "8", "--rounds", "2",
            "--reps", "1", "--providers", "torch,native", "--out", str(out)]
    bench_decoder_step.main(argv)
    rows = read_csv([out])
    assert set(BASE_COLUMNS) <= set(rows[0])
    assert sorted((r["provider"], r["new_tokens"]) for r in rows) == [
        ("native", "1"), ("native", "3"), ("torch", "1"), ("torch", "3")]
    for row in rows:
        _check_rounds(row, "2")
        assert row["command"] == "python -m benchmarks.bench_decoder_step " + " ".join(argv)
        assert float(row["max_abs_diff"]) < 1e-4  # the native step's logits are eager torch's
        assert float(row["vs_best_torch_min"]) <= float(row["vs_best_torch"]) <= float(row["vs_best_torch_max"])


@pytest.mark.skipif(not native.has_op("decoder_step", "cpu"), reason="specdec_kernels._C not built")
def test_bench_drafter_writes_interleaved_rounds_with_command(tmp_path):
    from benchmarks import bench_drafter

    out = tmp_path / "drafter.csv"
    argv = ["--heads", "rl_loop", "--rows", "2", "--k", "2", "--context", "4", "--rounds", "2", "--reps", "1",
            "--providers", "torch,native,triton", "--out", str(out)]
    bench_drafter.main(argv)
    rows = read_csv([out])
    assert set(BASE_COLUMNS) <= set(rows[0])
    ops = [*bench_drafter.OPS, "eagle3_propose_k2"]
    assert sorted((r["op"], r["provider"]) for r in rows) == sorted(
        [(op, "torch") for op in ops] + [(op, "triton") for op in ops] + [("eagle3_propose_k2", "native")])
    for row in rows:
        assert row["command"] == "python -m benchmarks.bench_drafter " + " ".join(argv)
        if row["provider"] == "triton":
            assert row["status"].startswith("skipped"), row  # CPU: the interpreter is not timed
            continue
        _check_rounds(row, "2")
        assert row["temperature"] == ("1" if row["op"] in ("lm_head_sample_q", "eagle3_propose_k2") else "")
        if row["op"] == "norm_fc":
            assert float(row["max_abs_diff"]) == 0.0
        else:
            assert row["matches_torch"] == "yes", row  # native head steps draft eager torch's tokens


def test_bench_tree_writes_sets_intervals_and_exact_with_command(tmp_path):
    from benchmarks import bench_tree

    out = tmp_path / "tree.csv"
    argv = ["--requests", "30", "--sets", "2", "--budgets", "3", "--workloads", "toy", "--out", str(out)]
    bench_tree.main(argv)
    rows = read_csv([out])
    command = "python -m benchmarks.bench_tree " + " ".join(argv)
    assert sorted((r["tree"], r["sibling_sampling"]) for r in rows) == [
        ("chain", "top-k"), ("dynamic", "top-k"), ("static", "iid"), ("static", "top-k"),
        ("static", "without_replacement")]
    for row in rows:
        assert row["command"] == command and row["sets"] == "2" and row["temperature"] == "1"
        mean = float(row["mean_accepted"])
        assert float(row["ci95_low"]) <= mean <= float(row["ci95_high"]), row
        assert float(row["set_min"]) <= mean <= float(row["set_max"]) <= 3, row
        assert (row["exact"] != "") == (row["sibling_sampling"] == "top-k"), row
        if row["exact"]:
            diff = float(row["minus_exact"])
            assert diff == pytest.approx(mean - float(row["exact"]), abs=2e-4), row
            assert float(row["minus_exact_ci95_low"]) <= diff <= float(row["minus_exact_ci95_high"]), row
    chain = next(r for r in rows if r["tree"] == "chain")
    assert 0 < float(chain["exact"]) < 3
    text = out.with_suffix(".md").read_text()
    assert command in text and text.count("| 3 |") == 2


@pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built")
def test_bench_native_cpu_runs_bf16_alone(tmp_path):
    """--dtypes bfloat16 alone: the fp32 copy probe has no fp32 read beside it (was a KeyError)."""
    from benchmarks import bench_native_cpu, native_cpu_table

    out = tmp_path / "bf16.csv"
    bench_native_cpu.main(["--batch", "2", "--k", "2", "--vocab", "64", "--rounds", "1", "--reps", "1",
                           "--fast-reps", "1", "--evict-mib", "16", "--families", "flat", "--dtypes", "bfloat16",
                           "--modes", "random_det", "--providers", "ours", "--out", str(out)])
    rows = read_csv([out])
    assert {r["dtype"] for r in rows if r["provider"] == "ours"} == {"bfloat16"}
    copy = next(r for r in rows if r["provider"] == "copy")
    assert copy["read_gbs"] == "" and float(copy["copy_gbs"]) > 0
    assert "| bfloat16 | flat | random_det |" in native_cpu_table.table(rows)


@pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built")
@pytest.mark.slow
def test_bench_native_cpu_writes_interleaved_rounds_with_command(tmp_path):
    from benchmarks import bench_native_cpu

    out = tmp_path / "native.csv"
    argv = ["--batch", "2", "--k", "2", "--vocab", "64", "--rounds", "2", "--reps", "1", "--fast-reps", "2",
            "--families", "flat,zipf",
            "--dtypes", "float32,bfloat16", "--modes", "greedy,random_stoch", "--providers", "ours,torch",
            "--evict-mib", "16", "--out", str(out)]
    bench_native_cpu.main(argv)
    rows = read_csv([out])
    assert set(BASE_COLUMNS) <= set(rows[0])
    timed = [r for r in rows if r["provider"] in ("ours", "torch")]
    assert len(timed) == 2 * 2 * 2 * 2 * 2  # families x dtypes x modes x drafts x providers
    assert {r["provider"] for r in rows} == {"ours", "torch", "stream", "int16", "sum", "copy", "stream_read",
                                             "int16_read", "sum_read", "stream_need", "int16_need", "sum_need"}
    assert {r["provider"]: r["repeats"] for r in timed} == {"ours": "2", "torch": "1"}  # --fast-reps, --reps
    # Three same-size reads per case, of exactly the bytes the case must read; the fastest of the three in a
    # round is the reference, so no probe's fraction of it exceeds 1.
    same_size = [r for r in rows if r["provider"] in ("stream_need", "int16_need", "sum_need")]
    assert len(same_size) == 3 * len(timed) // 2 and all(float(r["same_size_fraction_max"]) <= 1 for r in same_size)
    cases = bench_native_cpu.build_cases(torch.randn(8, 64), "flat", bench_native_cpu.parse_args(argv),
                                         torch.Generator().manual_seed(0))
    for c in cases:  # the probes read the bytes counted, whatever the dtype
        need = 3 * 64 * c.logits.element_size()
        w, x = bench_native_cpu.same_size_words(c, need), bench_native_cpu.same_size_entries(c, need)
        assert w.is_contiguous() and w.numel() * 4 == need and x.numel() * x.element_size() == need
    # Each dtype's fractions are against a read of its own logits: probe rows per (family, dtype), copy fp32.
    probes = {(r["family"], r["dtype"], r["provider"]): r for r in rows
              if r["provider"] in ("stream", "int16", "sum", "copy")}
    reads = {(f, d, p) for f in ("flat", "zipf") for d in ("float32", "bfloat16") for p in ("stream", "int16", "sum")}
    assert set(probes) == reads | {(f, "float32", "copy") for f in ("flat", "zipf")}
    # A case's fractions are against its own read probes (timed next to ours): its rows share its read_gbs,
    # which is the whole tensor's bytes over the faster probe's time in each round (median).
    by_case = {}
    for row in rows:
        if row["provider"] not in ("stream", "int16", "sum", "copy"):
            key = (row["family"], row["dtype"], row["mode"], row["drafts"])
            by_case.setdefault(key, set()).add(row["read_gbs"])
    assert len(by_case) == len(timed) // 2 and all(len(v) == 1 for v in by_case.values())
    for row in timed:
        tensor_bytes = 6 * 64 * (2 if row["dtype"] == "bfloat16" else 4)  # (k + 1) B rows of V entries
        probes_of_case = [r for r in rows if r["provider"] in ("stream_read", "int16_read", "sum_read")
                          and all(r[c] == row[c] for c in ("family", "dtype", "mode", "drafts"))]
        fastest = min(float(r["min_ms"]) for r in probes_of_case)
        slowest = min(float(r["max_ms"]) for r in probes_of_case)  # each round's faster probe is no slower
        assert len(probes_of_case) == 3
        gbs = float(row["read_gbs"])
        assert tensor_bytes / slowest / 1e6 * 0.999 <= gbs <= tensor_bytes / fastest / 1e6 * 1.001
        assert int(row["must_read_bytes"]) % (64 * (2 if row["dtype"] == "bfloat16" else 4)) == 0
    for row in rows:
        assert row["status"] == "ok", row
        assert row["command"] == "python -m benchmarks.bench_native_cpu " + " ".join(argv)
        assert row["evict_mib"] == "16"
        assert float(row["min_ms"]) <= float(row["median_ms"]) <= float(row["max_ms"]) and row["rounds"] == "2"
    for row in timed:
        for c in ("read_fraction", "same_size_fraction"):
            assert 0 < float(row[c + "_min"]) <= float(row[c]) <= float(row[c + "_max"])
    # Drafts equal to the target's own samples (or q = p) are all accepted.
    assert all(r["mean_accepted"] == "2.000" for r in timed if r["drafts"] == "accept")
    from benchmarks import native_cpu_table

    lines = native_cpu_table.table(rows).splitlines()
    assert len(lines) == 2 + 2 * 2 * 2 * 2  # header, rule, one line per case
    assert native_cpu_table.bandwidth(rows).count("read") == 4
    assert all(line.count("|") == 16 for line in lines)


@pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built")
def test_bench_native_cpu_fractions_use_the_case_own_read_probes(tmp_path):
    """A case's read_fraction is against the read probes timed next to ours (stream_read / int16_read /
    sum_read), not the family's stream / int16 / sum probes, which can run tens of seconds away. With one
    round every CSV figure is that round's, so the relation is exact: read_gbs = tensor bytes / the fastest
    probe, read_fraction =
    must_read_bytes / our time / read_gbs (the family probes' times, taken at another moment, match that only
    by chance). And ours is timed next to its probes in both directions."""
    from benchmarks import bench_native_cpu

    out = tmp_path / "native.csv"
    bench_native_cpu.main(["--batch", "2", "--k", "2", "--vocab", "4096", "--rounds", "1", "--reps", "1",
                           "--fast-reps", "1", "--evict-mib", "16", "--families", "flat", "--dtypes", "float32",
                           "--modes", "greedy", "--drafts", "model", "--providers", "ours", "--out", str(out)])
    rows = {r["provider"]: r for r in read_csv([out])}
    tensor_bytes = 6 * 4096 * 4
    case_gbs = tensor_bytes / min(float(rows[p]["median_ms"]) for p in bench_native_cpu.READ_PROBES) / 1e6
    ours = rows["ours"]
    assert float(ours["read_gbs"]) == pytest.approx(case_gbs, rel=2e-3)
    expected = int(ours["must_read_bytes"]) / float(ours["median_ms"]) / 1e6 / float(ours["read_gbs"])
    assert float(ours["read_fraction"]) == pytest.approx(expected, rel=5e-3)
    order = bench_native_cpu._case_order(["vllm", "ours", "torch"])
    assert order[:7] == ["ours", *bench_native_cpu.PROBES] and order[::-1][-7:] == order[:7][::-1]


@pytest.mark.skipif(not native.has_device("cpu") or not HAS_VLLM, reason="needs specdec_kernels._C and vllm")
@pytest.mark.slow
def test_bench_native_cpu_times_vllm_step_and_kernel(tmp_path):
    """Both vLLM providers run every mode, the step (RejectionSampler.forward) emits our greedy tokens from
    the same [T + B, V] logits, and the table gives both ratios."""
    from benchmarks import bench_native_cpu, native_cpu_table, vllm_v1

    out = tmp_path / "native.csv"
    argv = ["--batch", "3", "--k", "2", "--vocab", "96", "--rounds", "1", "--reps", "1", "--families", "flat",
            "--dtypes", "float32", "--providers", "ours,vllm_step,vllm", "--out", str(out)]
    bench_native_cpu.main(argv)
    rows = read_csv([out])
    timed = [r for r in rows if r["provider"] in ("vllm_step", "vllm")]
    assert len(timed) == 2 * 3 * 2 and all(r["status"] == "ok" for r in timed)  # providers x modes x drafts
    line = native_cpu_table.table(rows).splitlines()[2]
    assert line.count("x |") == 2 and line.endswith("| — |")  # the two vLLM ratios; no torch provider ran

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(3 * 3, 96, generator=gen)
    drafts = logits.view(3, 3, 96)[:, :2].argmax(-1).flatten()
    drafts[1] = (drafts[1] + 1) % 96  # request 0 rejects its second draft
    v1 = vllm_v1.load()
    step = vllm_v1.step(v1, logits, drafts, None, 3, 2, vllm_v1.sampling_metadata(v1, torch.zeros(3)))
    res = sk.verify_chain(logits, drafts, torch.arange(4) * 2, backend="cpu")
    assert step().sampled_token_ids.tolist() == res.output_token_ids.tolist()


def test_torch_verify_baseline_is_a_chain_verifier():
    from benchmarks.bench_native_cpu import torch_verify

    logits = torch.full((2 * 3, 5), -30.0)
    logits[torch.arange(6), torch.tensor([1, 2, 3, 4, 0, 1])] = 0.0  # one-hot targets
    drafts = torch.tensor([1, 2, 0, 0])  # request 0: all accepted; request 1: first draft rejected
    for mode in ("greedy", "random_det"):
        out, accepted = torch_verify(logits, drafts, None, mode, batch=2, k=2)
        assert accepted.tolist() == [2, 0]
        assert out.tolist() == [[1, 2, 3], [4, -1, -1]]
    q = torch.softmax(logits.view(2, 3, 5)[:, :2], dim=-1).reshape(4, 5)
    out, accepted = torch_verify(logits, torch.tensor([1, 2, 4, 0]), q, "random_stoch", batch=2, k=2)
    assert accepted.tolist() == [2, 2]  # q = p: every draft is accepted
    assert out.tolist() == [[1, 2, 3], [4, 0, 1]]


def test_eviction_is_twice_the_last_level_cache(tmp_path):
    """The eviction write is sized from the largest cache sysfs reports (a 480 MiB L3 leaves data cached
    after a 256 MiB write), never below 256 MiB; an unreadable or missing size counts as none."""
    from benchmarks import bench_native_cpu
    from benchmarks.common import largest_cache_bytes

    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "491520K"), ("index4", "junk")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    (tmp_path / "index5").mkdir()  # no size file
    assert largest_cache_bytes(tmp_path) == 480 << 20
    assert largest_cache_bytes(tmp_path / "missing") == 0
    assert bench_native_cpu.evict_bytes(480 << 20) == 960 << 20
    assert bench_native_cpu.evict_bytes(32 << 20) == bench_native_cpu.evict_bytes(0) == 256 << 20
    with pytest.raises(SystemExit):
        bench_native_cpu.parse_args(["--evict-mib", "-1", "--out", str(tmp_path / "x.csv")])


@pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built")
@pytest.mark.slow
def test_ab_builds_times_two_checkouts_alternately(tmp_path, capsys, monkeypatch):
    """The before / after harness on one checkout given twice: a row per case with both builds' rounds,
    the ratio of medians and the command, appended to the history table under the run's pair label; a
    bad argument is one clear error."""
    from benchmarks import ab_builds

    out = tmp_path / "ab.csv"
    argv = ["--before", str(ab_builds.REPO), "--rounds", "2", "--reps", "1", "--batch", "2", "--k", "2",
            "--vocab", "300", "--dtypes", "float32", "--modes", "greedy,random_stoch", "--families", "flat",
            "--out", str(out)]
    ab_builds.main(argv)
    ab_builds.main([*argv, "--pair", "second", "--rounds", "1"])
    history = read_csv([out])
    assert [r["pair"] for r in history].count("second") == len(history) // 2
    rows = [r for r in history if r["pair"] != "second"]
    commit = ab_builds._commit_of(str(ab_builds.REPO))
    assert {r["pair"] for r in rows} == {f"ab_cpu_{commit[:7]}_vs_{commit[:7]}"}
    assert {(r["before_commit"], r["after_commit"]) for r in rows} == {(commit, commit)}
    cases = {r["case"] for r in rows if r["provider"] == "ours"}
    assert cases == {f"flat/float32/{m}/{d}" for m in ("greedy", "random_stoch") for d in ("accept", "model")}
    assert {r["case"] for r in rows if r["provider"] == "read"} == {"read_gbs/flat/float32"}
    isa = native._load().CPU_ISA
    for r in rows:
        assert r["rounds"] == "2" and r["command"] == "python -m benchmarks.ab_builds " + " ".join(argv)
        assert r["device"].endswith(f" isa={isa}")  # the build both checkouts ran, as bench_native_cpu records it
        assert float(r["before_min_ms"]) <= float(r["before_median_ms"]) <= float(r["before_max_ms"])
        ratio = float(r["after_median_ms"]) / float(r["before_median_ms"])
        assert float(r["after_over_before"]) == pytest.approx(ratio, rel=2e-3)  # three 4-digit roundings
        if r["provider"] == "ours":  # rows up to the first rejection, one bonus row when all accepted
            rows_read = int(r["must_read_bytes"]) // (300 * 4)
            assert int(r["must_read_bytes"]) == rows_read * 300 * 4 and 2 <= rows_read <= 2 * 3
            assert all(float(r[f"{label}_read_fraction"]) > 0 for label in ("before", "after"))
    monkeypatch.setenv("SPECDEC_CPU_ISA", "generic")  # a capped build: the setting is part of the command
    ab_builds.main([*argv, "--pair", "capped", "--rounds", "1"])
    capped = [r for r in read_csv([out]) if r["pair"] == "capped"]
    assert {r["command"] for r in capped} == {"SPECDEC_CPU_ISA=generic python -m benchmarks.ab_builds " +
                                             " ".join([*argv, "--pair", "capped", "--rounds", "1"])}
    assert {r["device"].rsplit(" ", 1)[1] for r in capped} == {"isa=generic"}
    monkeypatch.delenv("SPECDEC_CPU_ISA")
    ab_builds.main([*argv, "--pair", "sides", "--rounds", "1", "--before-isa", "generic"])  # one side capped
    sides = {r["device"].split(" isa", 1)[1] for r in read_csv([out]) if r["pair"] == "sides"}
    assert sides == ({"=generic"} if isa == "generic" else {f" before=generic after={isa}"})
    with pytest.raises(SystemExit):
        ab_builds.main(["--before", str(tmp_path), "--out", str(out)])  # no checkout there
    other = tmp_path / "other.csv"
    other.write_text("name,value\na,1\n")
    with pytest.raises(SystemExit):
        ab_builds.main([*argv[:-1], str(other)])  # not an A/B history table: refused before any round
    assert "cannot append" in capsys.readouterr().err
    assert other.read_text() == "name,value\na,1\n"
    with pytest.raises(ValueError, match="cannot append"):
        CsvWriter(other, ab_builds.COLUMNS, append=True)


def test_call_overhead_times_every_call_cold_and_warm(capsys):
    result = call_overhead.main(["--calls", "2", "--batch", "4", "--vocab", "32"])
    assert set(result) == {"verify_chain", "native_op", "torch.sum(16)", "stream_sum(16)"}
    assert all(cold > 0 and warm > 0 for cold, warm in result.values())
    assert "from evicted caches / warm" in capsys.readouterr().out


def test_bench_sampling_mask_times_off_and_on_interleaved(capsys, tmp_path):
    from benchmarks import bench_sampling_mask

    backend = "cpu" if native.has_device("cpu") else "reference"
    out_csv = tmp_path / "mask.csv"
    result = bench_sampling_mask.main(["--rounds", "2", "--reps", "1", "--batch", "3", "--vocab", "700",
                                       "--backend", backend, "--out", str(out_csv), "--note", "shared"])
    assert set(result) == {(backend, name, mode) for name in bench_sampling_mask.TRUNCATIONS
                           for mode in bench_sampling_mask.MODES}
    assert all(0 < low <= median <= high for median, low, high in result.values())
    out = capsys.readouterr().out
    assert "untruncated" in out and "emitted tokens" in out
    rows = read_csv([out_csv])
    assert len(rows) == 9 and {r["mode"] for r in rows} == set(bench_sampling_mask.MODES)
    assert all(r["command"].startswith("python -m benchmarks.bench_sampling_mask --rounds 2") and r["git_commit"]
               and r["device"] and r["note"] == "shared" for r in rows)
    with pytest.raises(SystemExit):
        bench_sampling_mask.main(["--rounds", "0"])
    assert "--rounds must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_sampling_mask.main(["--backend", "cpu,nope"])
    assert "--backend nope: not available on cpu" in capsys.readouterr().err
    both = bench_sampling_mask.main(["--rounds", "1", "--reps", "1", "--batch", "2", "--vocab", "300",
                                     "--backend", f"{backend},reference", "--out", str(out_csv)])
    assert {key[0] for key in both} == {backend, "reference"}  # each backend in turn, rows per backend
    assert sorted({r["provider"] for r in read_csv([out_csv])}) == sorted({backend, "reference"})


def test_call_overhead_rejects_bad_counts(capsys):
    with pytest.raises(SystemExit):
        call_overhead.main(["--calls", "0"])
    assert "--calls must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built")
def test_overlap_probe_reports_the_exposed_compute(capsys):
    """Tiny shapes: every timing is positive, the rows read are the case's (B = 4 requests, every draft
    accepted: k + 1 rows each), and the exposed fraction is the printed formula of those medians."""
    r = overlap_probe.main(["--vocab", "512", "--batch", "4", "--k", "2", "--rounds", "2", "--cache-calls", "2"])
    assert all(r[f"{name} {kind}"] > 0 for name in ("ours", "read") for kind in ("cold", "rerun"))
    assert r["rows"] == 4 * 3 and r["compute_per_thread"] >= 0
    if r["compute_per_thread"] > 0:
        assert r["exposed"] == pytest.approx((r["ours cold"] - r["read cold"]) / r["compute_per_thread"])
    assert "exposed fraction of that compute" in capsys.readouterr().out


def test_overlap_probe_rejects_bad_arguments(capsys):
    for argv in (["--rounds", "0"], ["--vocab", "32"], ["--family", "nope"]):
        with pytest.raises(SystemExit):
            overlap_probe.main(argv)
    err = capsys.readouterr().err
    assert "--rounds must be >= 1" in err and "--vocab must be >= 64" in err and "invalid choice" in err


@pytest.mark.skipif(not native.has_device("cpu"), reason="specdec_kernels._C not built")
def test_stream_compute_probe_reports_the_exposed_work(capsys):
    """Tiny sizes: rounds 0 is always measured, every timing is positive, and the exposed fraction is the
    printed formula of those medians."""
    r = stream_compute_probe.main(["--mib", "2", "--rounds-list", "4", "--repeats", "2", "--cache-kib", "64",
                                   "--cache-calls", "3"])
    assert sorted(r) == [0, 4]
    assert all(row["cold"] > 0 and row["cached"] > 0 for row in r.values())
    row = r[4]
    assert row["added_cold"] == pytest.approx(row["cold"] - r[0]["cold"])
    assert row["added_cached"] == pytest.approx(row["cached"] - r[0]["cached"])
    if row["added_cached"] > 0:
        assert row["exposed"] == pytest.approx(row["added_cold"] / row["added_cached"])
    assert "exposed" in capsys.readouterr().out


def test_stream_compute_probe_rejects_bad_arguments(capsys):
    for argv in (["--repeats", "0"], ["--rounds-list", "2,x"], ["--rounds-list", "2000"]):
        with pytest.raises(SystemExit):
            stream_compute_probe.main(argv)
    err = capsys.readouterr().err
    assert "--repeats must be >= 1" in err and "comma-separated integers" in err
    assert "--rounds-list entries must be in [0, 1024], got 2000" in err
    with pytest.raises(SystemExit, match="--mib 1099511627776 cannot be allocated"):
        stream_compute_probe.main(["--mib", str(2**40)])


def _sweep_rows(fractions: dict[tuple[str, str, str, str], tuple[float, float, float]],
                step_ms: float = 100.0) -> list[dict[str, str]]:
    """bench_native_cpu-like rows: ours' read fractions (median, min, max) per case, a vLLM step per flat
    every-draft-accepted case, and a provenance the table prints."""
    info = {"command": "python -m benchmarks.bench_native_cpu", "device": "cpu", "git_commit": "abc",
            "date_utc": "2026-12-05T00:00:00Z", "status": "ok", "mean_accepted": "3.000"}
    rows = []
    for (dtype, family, mode, drafts), (med, lo, hi) in fractions.items():
        case = {**info, "dtype": dtype, "family": family, "mode": mode, "drafts": drafts}
        rows.append({**case, "provider": "ours", "median_ms": "2", "min_ms": "1.9", "max_ms": "2.1",
                     "read_fraction": str(med), "read_fraction_min": str(lo), "read_fraction_max": str(hi),
                     "same_size_fraction": str(med), "same_size_fraction_min": str(lo),
                     "same_size_fraction_max": str(hi)})
        if family == "flat" and drafts == "accept":
            rows.append({**case, "provider": "vllm_step", "median_ms": str(step_ms), "min_ms": str(step_ms),
                         "max_ms": str(step_ms)})
    return rows


def test_native_cpu_table_reports_targets_and_moves_against_a_reference(tmp_path, capsys):
    """The targets line names the lowest case of each mode and says whether its median meets the floor;
    --against flags a case whose median left the reference's [min, max] widened by the tolerance."""
    from benchmarks import native_cpu_table

    ref = {("bfloat16", "flat", "greedy", "accept"): (0.95, 0.93, 0.97),
           ("bfloat16", "flat", "greedy", "model"): (0.84, 0.81, 0.88),
           ("bfloat16", "flat", "random_stoch", "accept"): (0.83, 0.82, 0.85),
           ("bfloat16", "zipf", "random_stoch", "model"): (0.58, 0.57, 0.59)}
    new = {**ref, ("bfloat16", "flat", "greedy", "model"): (0.79, 0.78, 0.80),  # under the floor, above 81 - 5
           ("bfloat16", "zipf", "random_stoch", "model"): (0.50, 0.49, 0.51)}    # under 57 - 6: outside
    lines = native_cpu_table.targets(_sweep_rows(new, step_ms=7.0))
    assert lines[0].startswith("greedy: lowest 79 [78, 80] % of read bandwidth (bfloat16 flat greedy model)")
    assert lines[0].endswith("NOT met")
    assert lines[1].startswith("random_stoch: lowest 50 [49, 51]") and lines[1].endswith(": met")
    assert lines[2].startswith("vLLM step / ours, flat, every draft accepted: lowest 3.5x")
    assert lines[2].endswith("NOT met")
    assert all(line.endswith(": met") for line in native_cpu_table.targets(_sweep_rows(ref)))

    table = native_cpu_table.against(_sweep_rows(new), _sweep_rows(ref), tolerance=5)
    assert [line for line in table[2:-2] if "NO |" in line] == [
        "| bfloat16 | zipf | random_stoch | model | 58 [57, 59] | 50 [49, 51] | -8 | NO |"]
    assert table[-1].startswith("3 of 4 cases within")
    assert "moves from -8.0 (bfloat16 zipf random_stoch model)" in table[-1]
    assert native_cpu_table.against(_sweep_rows(new), _sweep_rows(ref), tolerance=8)[-1].startswith("4 of 4")

    ref_csv, new_csv = tmp_path / "ref.csv", tmp_path / "new.csv"
    for path, fr in ((ref_csv, ref), (new_csv, new)):
        rows = _sweep_rows(fr)
        with CsvWriter(path, list(rows[0])) as w:
            for r in rows:
                w.write(r)
    native_cpu_table.main([str(new_csv), "--against", str(ref_csv)])
    out = capsys.readouterr().out
    assert "greedy: lowest 79" in out and "3 of 4 cases within the reference's [min, max] ±6 points" in out
    with pytest.raises(SystemExit):
        native_cpu_table.main([str(new_csv), "--tolerance", "-1"])
    assert "--tolerance must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        native_cpu_table.main([str(new_csv), "--tolerance", "nan"])
    with pytest.raises(SystemExit) as exc:
        native_cpu_table.main([str(new_csv), "--against", str(tmp_path / "missing.csv")])
    assert str(exc.value).startswith("native_cpu_table: cannot read the CSV")
    other = tmp_path / "other.csv"
    other.write_text("name,value\na,1\n")
    with pytest.raises(SystemExit) as exc:
        native_cpu_table.main([str(other)])
    assert str(exc.value).startswith(f"native_cpu_table: {other} is not a bench_native_cpu CSV (no provider,")


def test_committed_results_carry_the_command_that_wrote_them():
    """Every committed result CSV names, in every row, the one command that wrote it; a sweep's command
    writes to the file's own path. The A/B history holds one command per run (pair label), an ab_builds
    command, each run's rows contiguous. A command may start with the ``SPECDEC_CPU_ISA=<isa>`` it ran under."""
    import re

    def without_isa(command: str) -> str:
        return re.sub(r"^SPECDEC_CPU_ISA=(generic|avx2|avx512) ", "", command)

    results = REPO / "results" / "benchmarks"
    csvs = sorted(results.glob("*.csv"))
    assert any(p.name == "chain_cpu_b64_k3_v151936.csv" for p in csvs)
    for path in csvs:
        rows = read_csv([path])
        if path.name == "ab_history.csv":
            pairs = [r["pair"] for r in rows]
            runs = [p for i, p in enumerate(pairs) if i == 0 or pairs[i - 1] != p]
            assert len(runs) == len(set(runs)), "a run's rows must be contiguous"
            for pair in runs:
                commands = {r["command"] for r in rows if r["pair"] == pair}
                assert len(commands) == 1, (pair, commands)
                assert without_isa(commands.pop()).startswith("python -m benchmarks.ab_builds --before "), pair
            continue
        commands = {r.get("command") or "" for r in rows}
        assert rows and len(commands) == 1, (path.name, commands)
        command = without_isa(as_run_today(commands.pop()))  # the names the recorded command had then, as today's
        assert command.startswith("python -m benchmarks."), (path.name, command)
        args = command.split()
        assert "--out" in args and args[args.index("--out") + 1] == f"results/benchmarks/{path.name}", command


def test_ab_history_holds_every_committed_ab_run():
    """The per-pair A/B files were merged into the history table: the 10 runs (259 rows) whose after build was
    a clean commit, and the runs appended since (the 7 from checkouts with uncommitted changes were removed)."""

    rows = read_csv([REPO / "results" / "benchmarks" / "ab_history.csv"])
    assert len({r["pair"] for r in rows}) >= 10 and len(rows) >= 259
    assert all(r["before_commit"] and r["after_commit"] and r["case"] for r in rows)
