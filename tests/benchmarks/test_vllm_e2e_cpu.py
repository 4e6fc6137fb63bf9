"""benchmarks/vllm_e2e_cpu.py: the interleaving, the summary and its table, the verdicts it reads, the
model it builds (fast), and one run on a tiny model through real vLLM engines (slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from benchmarks import vllm_e2e_cpu as bench
from benchmarks.common import BASE_COLUMNS, read_csv
from tests.conftest import REPO

Arm = bench.Arm


def test_schedule_runs_every_arm_once_per_repeat_and_alternates_the_plugin_first():
    specs = ["none", "ngram", "draft"]
    schedule = bench.interleaved_schedule(specs, 3)
    arms = [Arm("none", False), Arm("ngram", False), Arm("ngram", True), Arm("draft", False), Arm("draft", True)]
    for r in range(3):
        ran = [arm for repeat, arm in schedule if repeat == r]
        assert sorted(ran, key=arms.index) == arms  # every arm once; no plugin arm without speculation
    assert [a.label for r, a in schedule if r == 0] == ["none", "ngram+vllm", "ngram+plugin", "draft+vllm",
                                                       "draft+plugin"]
    assert [a.label for r, a in schedule if r == 1] == ["draft+plugin", "draft+vllm", "ngram+plugin", "ngram+vllm",
                                                       "none"]
    assert [r for r, _ in schedule] == sorted(r for r, _ in schedule)  # repeats run one after another


def _record(spec, plugin, repeat, batch, seconds, tokens=32, drafts=0, draft_tokens=0, accepted=0):
    return {"arm": Arm(spec, plugin), "repeat": repeat, "batch": batch, "seconds": seconds, "tokens": tokens,
            "startup_s": 10.0 + repeat, "drafts": drafts, "draft_tokens": draft_tokens, "accepted": accepted}


VERDICTS = {"vllm-v1-cpu": "INCOMPLETE, 38 of 42 law cases rejected", "cpu": "PASS, 0 of 52 law cases rejected"}


def test_summary_medians_spread_speedup_and_tokens_per_step():
    records = [_record("none", False, r, 1, s) for r, s in enumerate((2.0, 4.0, 1.0))]
    records += [_record("draft", True, r, 1, s, drafts=10, draft_tokens=30, accepted=a)
                for r, (s, a) in enumerate(((1.0, 20), (0.5, 10), (2.0, 0)))]
    records += [_record("draft", False, 0, 1, 8.0, drafts=30, draft_tokens=90, accepted=3)]
    rows = bench.summarise(records, VERDICTS)
    assert [r["arm"].label for r in rows] == ["none", "draft+vllm", "draft+plugin"]
    none, vllm, ours = rows
    assert none["tok_s_runs"] == [16.0, 8.0, 32.0] and none["tok_s_median"] == 16.0
    assert (none["tok_s_min"], none["tok_s_max"], none["tokens_per_step"]) == (8.0, 32.0, 1.0)
    assert ours["tok_s_median"] == 32.0 and ours["speedup_vs_ar"] == 2.0
    assert ours["tokens_per_step"] == pytest.approx(1 + 30 / 30) and ours["acceptance_rate"] == pytest.approx(1 / 3)
    assert vllm["tokens_per_step"] == pytest.approx(1.1) and vllm["speedup_vs_ar"] == 0.25
    assert (ours["audit_report"], vllm["audit_report"], none["audit_report"]) == ("cpu", "vllm-v1-cpu", "")
    assert ours["audit_verdict"].startswith("PASS") and vllm["audit_verdict"].startswith("INCOMPLETE")
    assert ours["startup_s_median"] == 11.0


def test_plugin_verdict_is_the_plugin_report_when_there_is_one():
    assert bench.verifier_report(Arm("ngram", True), {**VERDICTS, "vllm-v1-plugin": "PASS"}) == "vllm-v1-plugin"
    assert bench.verifier_report(Arm("ngram", True), VERDICTS) == "cpu"
    assert bench.verifier_report(Arm("ngram", False), VERDICTS) == "vllm-v1-cpu"
    assert bench.verifier_report(Arm("none", False), VERDICTS) == ""


def test_table_has_one_line_per_row_with_spread_and_verdict():
    records = [_record("none", False, 0, 4, 2.0), _record("ngram", False, 0, 4, 4.0, drafts=5, draft_tokens=15,
                                                           accepted=5)]
    table = bench.markdown_table(bench.summarise(records, VERDICTS))
    lines = table.splitlines()
    assert len(lines) == 4 and lines[1].startswith("|---:")
    assert lines[2] == "| 4 | none | — | 16.0 [16.0, 16.0] | 1.00x | 1.00 | 10 | — (no verification) |"
    assert lines[3] == ("| 4 | ngram | vLLM CPU | 8.0 [8.0, 8.0] | 0.50x | 2.00 | 10 "
                        "| INCOMPLETE, 38 of 42 law cases rejected (`vllm-v1-cpu`) |")


def test_verdicts_come_from_the_committed_reports():
    verdicts = bench.audit_verdicts(REPO / "results" / "audit")
    assert verdicts["cpu"].startswith("PASS, 0 of ")
    assert verdicts["vllm-v1-cpu"].split(",")[0] in ("INCOMPLETE", "LOSSY")


def test_qwen3_preset_keeps_the_real_vocabulary_and_shapes():
    spec = bench.checkpoint_spec("qwen3-0.6b", 4)
    assert (spec.vocab_size, spec.hidden_size, spec.intermediate_size) == (151936, 1024, 3072)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.num_layers) == (16, 8, 128, 4)
    assert bench.checkpoint_spec("qwen3-0.6b", None).num_layers == 28
    assert "4 of Qwen3-0.6B's 28 layers" in bench.describe(spec, "qwen3-0.6b")
    with pytest.raises(ValueError, match="preset"):
        bench.checkpoint_spec("llama", None)


def test_draft_is_the_targets_first_layers(tmp_path):
    from transformers import Qwen3ForCausalLM

    from specdec_kernels.models.tiny_qwen3 import TinyQwen3Spec, build_target_and_draft

    target_dir, draft_dir = build_target_and_draft(tmp_path, TinyQwen3Spec(num_layers=3, draft_layers=1,
                                                                           num_kv_heads=1, embed_std=2.0))
    target = Qwen3ForCausalLM.from_pretrained(target_dir).state_dict()
    draft = Qwen3ForCausalLM.from_pretrained(draft_dir).state_dict()
    assert "model.layers.1.mlp.up_proj.weight" in target and "model.layers.1.mlp.up_proj.weight" not in draft
    assert all(torch.equal(t, target[name]) for name, t in draft.items())
    assert Qwen3ForCausalLM.from_pretrained(draft_dir).config.num_key_value_heads == 1
    assert target["model.embed_tokens.weight"].std().item() == pytest.approx(2.0, rel=0.1)
    with pytest.raises(ValueError, match="draft_layers"):
        build_target_and_draft(tmp_path / "bad", TinyQwen3Spec(num_layers=2, draft_layers=2))


def test_cli_refuses_bad_scales_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--repeats", "0"])
    assert exit_info.value.code == 2 and "--repeats must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--specs", "medusa"])


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("vllm_engine")
def test_tiny_run_writes_every_arm_with_provenance(tmp_path):
    """Every arm through real vLLM engines on a tiny model (1 repeat, 6 tokens): both verifiers' rows,
    their columns and provenance, the table beside the CSV; the plugin's draft arm accepts drafts."""
    pytest.importorskip("vllm")
    out = tmp_path / "e2e.csv"
    cmd = [sys.executable, "-m", "benchmarks.vllm_e2e_cpu", "--preset", "tiny", "--repeats", "1", "--batch-sizes",
           "1,2", "--max-tokens", "6", "--model-dir", str(tmp_path / "models"), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = read_csv([out])
    assert set(BASE_COLUMNS) | set(bench.COLUMNS) <= set(rows[0])
    assert all(r["command"].startswith("python -m benchmarks.vllm_e2e_cpu --preset tiny") and r["git_commit"]
               and r["device"] for r in rows)
    arms = sorted({(r["spec"], r["plugin"]) for r in rows})
    assert arms == [("draft", "0"), ("draft", "1"), ("eagle3", "0"), ("eagle3", "1"), ("ngram", "0"),
                    ("ngram", "1"), ("none", "0")]
    assert sorted(int(r["batch"]) for r in rows) == [1] * 7 + [2] * 7
    assert all(float(r["tok_s_median"]) > 0 and r["repeats"] == "1" for r in rows)
    verdicts = {r["plugin"]: r["audit_report"] for r in rows if r["spec"] != "none"}
    assert verdicts == {"0": "vllm-v1-cpu", "1": "cpu"}
    plugin_draft = [r for r in rows if (r["spec"], r["plugin"]) == ("draft", "1")]
    assert all(float(r["tokens_per_step"]) > 1 for r in plugin_draft)  # the tiny draft agrees with its target
    table = out.with_suffix(".md").read_text()
    assert table.count("\n| ") == 1 + len(rows) and "(`vllm-v1-cpu`)" in table and proc.stdout.strip() in table
