"""Sampling masks in rl_loop: the engine records each rollout token's kept set (``--record-mask``), and GRPO's
log-probabilities can be taken over it (``--mask-logprobs``)."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch

from rl_loop.__main__ import main as rl_main
from rl_loop.__main__ import parse_args
from rl_loop.config import tiny_config
from rl_loop.step import learn
from rl_loop.step.drafting import build_drafter
from rl_loop.step.engine import RolloutEngine
from rl_loop.step.learn import kept_batch, policy_optimizer, train_on_batch
from rl_loop.step.rollouts import GenerationConfig, RolloutMask, build_batch
from rl_loop.task import CharTokenizer
from rl_loop.train import run
from specdec_kernels.models import ModelConfig, Qwen3
from specdec_kernels.sampling_mask import kept_ids

pytestmark = [pytest.mark.rl, pytest.mark.usefixtures("one_thread")]
CFG = ModelConfig(num_hidden_layers=3, intermediate_size=96)
EOS = 2


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return Qwen3(CFG).eval()


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(3, 21, size=int(rng.integers(2, 7))).tolist()] for _ in range(n)]


def test_masked_log_probs_are_the_full_ones_where_all_is_kept_and_differ_by_the_log_kept_mass():
    """Rows kept whole (T = 1, no top-k / top-p): bit-identical; rows truncated by top-k / top-p
    (``kept_ids``, the verifier's rule): masked = full - log(kept mass) and strictly larger."""
    gen = torch.Generator().manual_seed(4)
    rows, vocab = 12, 32
    logits = torch.randn(rows, vocab, generator=gen) * 2
    top_k = torch.tensor([0, 5, 0, 9] * 3, dtype=torch.int32)
    top_p = torch.tensor([1.0, 1.0, 0.7, 0.9] * 3)
    kept_rows = kept_ids(logits, torch.ones(rows), top_k, top_p)
    kept = torch.zeros(rows, vocab, dtype=torch.bool)
    for r, ids in enumerate(kept_rows):
        kept[r, ids.long()] = True
    targets = torch.stack([ids[int(torch.randint(ids.numel(), (1,), generator=gen))] for ids in kept_rows]).long()
    full = learn.token_log_probs(logits[None], targets[None])[0]
    masked = learn.token_log_probs(logits[None], targets[None], kept[None])[0]
    whole = kept.all(-1)
    assert whole.any() and (~whole).any()
    assert torch.equal(masked[whole], full[whole])
    kept_mass = (torch.softmax(logits.double(), -1) * kept).sum(-1)
    assert (masked[~whole] > full[~whole]).all()
    torch.testing.assert_close((masked - full).double(), -kept_mass.log(), rtol=0, atol=1e-5)


def test_kept_batch_lays_the_masks_out_as_the_loss_mask():
    tok = CharTokenizer()
    prompts, responses, finished = [[1, 5, 6], [1, 7]], [[8, 9], [11]], [True, False]
    masks = [RolloutMask.of([torch.tensor([8, 3], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                             torch.tensor([EOS, 4], dtype=torch.int32)]),
             RolloutMask.of([torch.tensor([11], dtype=torch.int32)])]
    ids, mask = build_batch(prompts, responses, finished, tok)
    kept = kept_batch(prompts, masks, mask.shape[1], 16)
    assert kept.shape == (*mask.shape, 16)
    assert kept[0, 2].nonzero().flatten().tolist() == [3, 8] and kept[0, 3].nonzero().flatten().tolist() == [9]
    assert kept[0, 4].nonzero().flatten().tolist() == [EOS, 4] and kept[1, 1].nonzero().flatten().tolist() == [11]
    assert kept[~mask].all()  # rows the loss drops keep everything
    assert bool(kept.gather(-1, ids[:, 1:, None]).squeeze(-1)[mask].all())  # every target is in its kept set


@pytest.mark.parametrize("spec", ["none", "chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_records_one_kept_set_per_token(policy, spec, temperature):
    """One kept set per response token (and the EOS), holding the token: the argmax set at T = 0, the whole
    vocabulary at T = 1 (the engine does not truncate); recording changes no token."""
    engine = RolloutEngine(policy, build_drafter("eagle3", policy, seed=1), EOS)
    prompts, seeds = _prompts(6), list(range(6))
    cfg = GenerationConfig(spec=spec, k=2, temperature=temperature, max_new_tokens=10, max_batch=4)
    plain = engine.generate(prompts, seeds, cfg)
    rec = engine.generate(prompts, seeds, replace(cfg, record_mask=True))
    assert plain.masks is None and rec.response_ids == plain.response_ids and rec.finished == plain.finished
    vocab = policy.config.vocab_size
    for resp, fin, m in zip(rec.response_ids, rec.finished, rec.masks, strict=True):
        tokens = resp + ([EOS] if fin else [])
        assert m.indptr.numel() == len(tokens) + 1
        for t, token in enumerate(tokens):
            ids = m.indices[m.indptr[t]:m.indptr[t + 1]].tolist()
            assert token in ids
            assert ids == ([token] if temperature == 0 else list(range(vocab)))  # random weights: no exact ties


def test_mask_logprobs_without_truncation_is_a_no_op_on_the_step(policy):
    """Kept sets that are the whole vocabulary (T = 1 rollouts): the GRPO step (loss, ratio, updated
    weights) is bit-identical with and without them."""
    tok = CharTokenizer()
    engine = RolloutEngine(policy, None, EOS)
    prompts = _prompts(4, seed=1)
    out = engine.generate(prompts, list(range(4)), GenerationConfig(spec="none", max_new_tokens=8, record_mask=True))
    ids, mask = build_batch(prompts, out.response_ids, out.finished, tok)
    kept = kept_batch(prompts, out.masks, mask.shape[1], policy.config.vocab_size)
    cfg = replace(tiny_config(), minibatches=1, kl_coef=0.1)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    results = []
    for k in (None, kept):
        model = copy.deepcopy(policy)
        stats = train_on_batch(model, policy_optimizer(model, cfg.lr, cfg.output_gain_lr), ids, mask, adv, cfg, copy.deepcopy(policy),
                               kept=k)
        results.append(([stats[n] for n in ("loss", "ratio", "kl", "grad_norm")], model.state_dict()))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(results[0][1][n], results[1][1][n]) for n in results[0][1])


def test_flags_parse_and_mask_logprobs_implies_record_mask():
    cfg = parse_args(["--tiny", "--mask-logprobs"])
    assert cfg.mask_logprobs and cfg.record_mask and cfg.generation().record_mask
    cfg = parse_args(["--tiny", "--record-mask"])
    assert cfg.record_mask and not cfg.mask_logprobs
    default = parse_args(["--tiny"])
    assert not default.record_mask and not default.mask_logprobs and not default.generation().record_mask
    with pytest.raises(ValueError, match="--record-mask / --mask-logprobs need --backend own"):
        replace(tiny_config(), backend="vllm", mask_logprobs=True)


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.8)])
@pytest.mark.parametrize("spec", ["none", "chain", "tree"])
def test_truncated_rollouts_record_their_kept_sets_and_mask_logprobs_removes_the_dropped_mass(policy, spec, top_k,
                                                                                               top_p):
    """Rollouts at top_k = 5 or top_p = 0.8: each token lies in its recorded set (5 ids at top_k = 5); over a
    batch built from them, the masked log-probability is the full one minus the log of the kept mass."""
    tok = CharTokenizer()
    engine = RolloutEngine(policy, build_drafter("eagle3", policy, seed=1), EOS)
    prompts = _prompts(4, seed=2)
    cfg = GenerationConfig(spec=spec, k=2, max_new_tokens=8, max_batch=4, record_mask=True, top_k=top_k,
                           top_p=top_p)
    out = engine.generate(prompts, list(range(4)), cfg)
    for m in out.masks:
        sizes = m.indptr.diff()
        assert (sizes == 5).all() if top_k else (sizes < policy.config.vocab_size).all()
    ids, mask = build_batch(prompts, out.response_ids, out.finished, tok)
    kept = kept_batch(prompts, out.masks, mask.shape[1], policy.config.vocab_size)
    assert bool(kept.gather(-1, ids[:, 1:, None]).squeeze(-1)[mask].all())
    with torch.no_grad():
        logits = policy(ids)[0][:, :-1]
    full = learn.token_log_probs(logits, ids[:, 1:])[mask]
    masked = learn.token_log_probs(logits, ids[:, 1:], kept)[mask]
    kept_mass = (torch.softmax(logits.double(), -1) * kept).sum(-1)[mask]
    assert (masked > full).all()
    torch.testing.assert_close((masked - full).double(), -kept_mass.log(), rtol=0, atol=1e-5)


def test_truncation_arguments_are_checked():
    with pytest.raises(ValueError, match="top_k must be >= 0 and top_p in"):
        GenerationConfig(top_p=0.0)


def test_top_k_top_p_flags_reach_both_arms_generation():
    cfg = parse_args(["--tiny", "--top-k", "5", "--top-p", "0.9", "--mask-logprobs"])
    for gen in (cfg.generation(), cfg.generation(spec="none")):
        assert (gen.top_k, gen.top_p) == (5, 0.9)
    default = parse_args(["--tiny"]).generation()
    assert (default.top_k, default.top_p) == (0, 1.0)


@pytest.mark.parametrize("flags, message", [
    (["--top-k", "-1"], "--top-k must be >= 0, got -1"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--top-p", "nan"], "--top-p must be in (0, 1], got nan"),
    (["--top-k", "5", "--backend", "vllm"], "--top-k / --top-p need --backend own"),
])
def test_bad_truncation_flags_give_one_line(flags, message, capsys):
    assert rl_main(["--tiny", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.slow
def test_a_grpo_step_runs_with_mask_logprobs(tmp_path, monkeypatch):
    """A whole tiny run at top_k = 5: the step's rollouts carry masks and its log-probabilities are taken over
    them (five ids per response row)."""
    built = []

    def spy(prompts, masks, width, vocab_size):
        built.append(kept_batch(prompts, masks, width, vocab_size))
        return built[-1]

    monkeypatch.setattr(learn, "kept_batch", spy)
    run(tiny_config(out=str(tmp_path), steps=1, mask_logprobs=True, top_k=5, equivalence=False, compare_every=0,
                    dynamic_sampling=False))  # train on every group, even all-equal rewards
    assert built and built[0].shape[-1] == tiny_config().model.vocab_size
    sizes = built[0].sum(-1)
    assert (sizes == 5).any() and ((sizes == 5) | (sizes == built[0].shape[-1])).all()
    assert (tmp_path / "summary.json").exists()
