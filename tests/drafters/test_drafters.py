"""Drafter heads through the batched protocol: shapes, cache semantics, trees, randomness, validation."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels import native
from specdec_kernels.drafters.base import STREAM_DRAFT, DraftProposal
from specdec_kernels.drafters.draft_model import DraftModelDrafter, DraftModelHead
from specdec_kernels.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, default_feature_layers
from specdec_kernels.drafters.features import capture_target_features
from specdec_kernels.drafters.head_ops import head_sample
from specdec_kernels.drafters.mtp import MtpDrafter, MtpHead
from specdec_kernels.models.tiny_qwen3 import tiny_qwen3
from specdec_kernels.reference import philox

V = 96


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target():
    return tiny_qwen3(vocab_size=V, hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64, seed=0)


def make_eagle(draft_vocab: int = 48, seed: int = 1) -> Eagle3Head:
    torch.manual_seed(seed)
    cfg = Eagle3Config(vocab_size=V, draft_vocab_size=draft_vocab, hidden_size=32, target_hidden_size=32,
                       intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16,
                       feature_layers=default_feature_layers(4))
    head = Eagle3Head(cfg)
    head.set_draft_vocab(torch.arange(0, 2 * draft_vocab, 2))
    with torch.no_grad():
        head.embed_tokens.weight.normal_()
        for p in head.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return head


def ragged_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (3, 9), generator=g)
    lengths = torch.tensor([9, 4, 7])
    nxt = torch.randint(0, V, (3,), generator=g)
    return ids, lengths, nxt


def test_default_feature_layers():
    assert default_feature_layers(36) == (2, 18, 33)
    for n in range(3, 40):
        a, b, c = default_feature_layers(n)
        assert 0 <= a < b < c < n
    with pytest.raises(ValueError, match="num_target_layers"):
        default_feature_layers(2)


@pytest.mark.slow
def test_eagle3_chain_shapes_and_vocab(target):
    head = make_eagle()
    d = Eagle3Drafter(head)
    ids, lengths, nxt = ragged_batch()
    with torch.no_grad():
        cap = capture_target_features(target, ids, head.cfg.feature_layers)
    assert cap.eagle3_features.shape == (3, 9, 3 * 32)
    d.prefill(ids, lengths, nxt, cap.eagle3_features)
    assert torch.equal(d.num_tokens, lengths + 1)
    greedy = d.propose(4)
    assert greedy.token_ids.shape == (3, 4) and greedy.token_ids.dtype == torch.int64
    assert greedy.probs is None
    assert bool(head.t2d[greedy.token_ids].all())  # every draft is a target id inside the draft vocab
    temp = torch.tensor([1.0, 0.0, 0.6])
    sampled = d.propose(4, temp, torch.tensor([1, 2, 3]))
    assert sampled.probs.shape == (3, 4, V) and sampled.probs.dtype == torch.float32
    torch.testing.assert_close(sampled.probs.sum(-1), torch.ones(3, 4))
    assert float(sampled.probs[..., ~head.t2d].abs().max()) == 0.0
    # the greedy row of a sampled proposal is the greedy chain
    assert torch.equal(sampled.token_ids[1], greedy.token_ids[1])
    tok, cu, probs = sampled.flat()
    assert tok.shape == (12,) and cu.tolist() == [0, 4, 8, 12] and probs.shape == (12, V)


def test_prefix_plus_commit_equals_full_prefill(target):
    """Committing verified tokens must leave the cache exactly as a prefill of the longer context."""
    head = make_eagle()
    ids, _, _ = ragged_batch(3)
    full_len = torch.tensor([9, 8, 9])
    with torch.no_grad():
        cap = capture_target_features(target, ids, head.cfg.feature_layers)
    feats = cap.eagle3_features
    nxt = torch.tensor([5, 6, 7])
    ref = Eagle3Drafter(head)
    ref.prefill(ids, full_len, nxt, feats)
    want = ref.propose_tree(3, 3, 2)

    d = Eagle3Drafter(head)
    start = torch.tensor([5, 6, 4])
    d.prefill(ids, start, ids[torch.arange(3), start], feats)
    n = full_len - start - 1  # accepted drafts; then the emitted token
    out = torch.full((3, 5), -1)
    rows = torch.zeros(3, 5, 3 * 32)
    for b in range(3):
        toks = torch.cat([ids[b, start[b] + 1: full_len[b]], nxt[b:b + 1]])
        out[b, : toks.numel()] = toks
        rows[b, : toks.numel()] = feats[b, start[b]: full_len[b]]
    d.commit(n, out, rows)
    got = d.propose_tree(3, 3, 2)
    assert torch.equal(d.num_tokens, ref.num_tokens)
    assert torch.equal(got.node_token_ids, want.node_token_ids)
    torch.testing.assert_close(got.log_probs, want.log_probs, rtol=1e-4, atol=1e-4)


def test_tree_structure_and_greedy_path_is_chain(target):
    head = make_eagle()
    d = Eagle3Drafter(head)
    ids, lengths, nxt = ragged_batch(1)
    with torch.no_grad():
        feats = capture_target_features(target, ids, head.cfg.feature_layers).eagle3_features
    d.prefill(ids, lengths, nxt, feats)
    tree = d.propose_tree(4, 3, 2)
    n = 1 + 3 + 3 * (2 * 3)
    assert tree.node_token_ids.shape == (3, n)
    assert torch.equal(tree.node_token_ids[:, 0], nxt)
    assert bool((tree.parent[:, 1:] < torch.arange(1, n)).all()) and bool((tree.parent[:, 0] == -1).all())
    par = tree.parent.clamp(min=0)
    assert torch.equal(tree.depth[:, 1:], tree.depth.gather(1, par)[:, 1:] + 1)
    # siblings ordered by decreasing cumulative log-prob
    for b in range(3):
        for p in tree.parent[b].unique().tolist():
            if p < 0:
                continue
            kids = (tree.parent[b] == p).nonzero().flatten()
            assert bool((tree.log_probs[b, kids].diff() <= 1e-6).all())
    # The first child at every level is the greedy token and beam search always expands it, so the
    # first-child path of the tree must be the greedy chain (exercises the ancestor masks).
    chain = d.propose(4).token_ids
    node = torch.zeros(3, dtype=torch.int64)
    for j in range(4):
        first = torch.stack([(tree.parent[b] == node[b]).nonzero().min() for b in range(3)])
        assert torch.equal(tree.node_token_ids[torch.arange(3), first], chain[:, j])
        node = first


@pytest.mark.slow
def test_draft_model_matches_transformers_on_chain_and_tree():
    """Cached speculative rows of a draft model must reproduce the transformers model's logits."""
    lm = tiny_qwen3(vocab_size=V, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                    intermediate_size=64, seed=5, transformers=True)
    d = DraftModelDrafter(lm)
    assert isinstance(d.head, DraftModelHead) and d.feature_size == 0
    ids, lengths, nxt = ragged_batch(2)
    d.prefill(ids, lengths, nxt, None)
    tree = d.propose_tree(3, 2, 2)
    for b in range(3):
        ctx = torch.cat([ids[b, : lengths[b]], nxt[b:b + 1]])
        for node in range(tree.node_token_ids.shape[1]):
            kids = (tree.parent[b] == node).nonzero().flatten()
            if kids.numel() == 0:
                continue
            path, cur = [], node
            while cur > 0:
                path.append(int(tree.node_token_ids[b, cur]))
                cur = int(tree.parent[b, cur])
            seq = torch.cat([ctx, torch.tensor(path[::-1], dtype=torch.int64)])
            with torch.no_grad():
                logits = lm(seq[None]).logits[0, -1]
            want = torch.log_softmax(logits, -1).topk(2)
            assert tree.node_token_ids[b, kids].tolist() == want.indices.tolist()
            torch.testing.assert_close(tree.log_probs[b, kids] - tree.log_probs[b, node], want.values,
                                       rtol=1e-4, atol=1e-4)


def test_mtp_head_shares_target_weights_and_proposes(target):
    head = MtpHead.from_target(target, intermediate_size=48)
    assert torch.equal(head.lm_head.weight, target.get_output_embeddings().weight)
    d = MtpDrafter(head)
    ids, lengths, nxt = ragged_batch()
    with torch.no_grad():
        cap = capture_target_features(target, ids)
    d.prefill(ids, lengths, nxt, cap.last_hidden)
    p = d.propose(3, torch.tensor([0.8, 0.8, 0.0]), torch.tensor([4, 5, 6]))
    assert p.token_ids.shape == (3, 3) and p.probs.shape == (3, 3, V)
    d.commit(torch.tensor([3, 0, 1]), torch.cat([p.token_ids, p.token_ids[:, :1]], 1), torch.randn(3, 4, 32))
    assert d.num_tokens.tolist() == (lengths + 1 + torch.tensor([4, 1, 2])).tolist()


def test_sampling_is_reproducible_and_batch_invariant(target):
    head = make_eagle()
    ids, lengths, nxt = ragged_batch()
    with torch.no_grad():
        feats = capture_target_features(target, ids, head.cfg.feature_layers).eagle3_features
    temp, seed = torch.tensor([1.0, 1.3, 0.7]), torch.tensor([10, 20, 30])
    d = Eagle3Drafter(head)
    d.prefill(ids, lengths, nxt, feats)
    a = d.propose_tree(3, 2, 2, temp, seed)
    b = d.propose_tree(3, 2, 2, temp, seed)
    assert torch.equal(a.node_token_ids, b.node_token_ids)
    one = Eagle3Drafter(head)
    one.prefill(ids[1:2], lengths[1:2], nxt[1:2], feats[1:2])
    c = one.propose_tree(3, 2, 2, temp[1:2], seed[1:2])
    assert torch.equal(c.node_token_ids[0], a.node_token_ids[1])
    torch.testing.assert_close(c.draft_probs[0], a.draft_probs[1])
    d.select(torch.tensor([2, 0]))
    e = d.propose_tree(3, 2, 2, temp[[2, 0]], seed[[2, 0]])
    assert torch.equal(e.node_token_ids, a.node_token_ids[[2, 0]])
    other = d.propose_tree(3, 2, 2, temp[[2, 0]], seed[[2, 0]] + 1)
    assert not torch.equal(other.node_token_ids, e.node_token_ids)


def test_draft_sampling_law_and_stream():
    """Gumbel-top-1 on stream 3 draws from q: chi-square over many seeds, and the noise is stream 3's."""
    from scipy.stats import chisquare

    torch.manual_seed(0)
    vd, vocab, n = 6, 9, 6000
    w = torch.randn(vd, 4)
    d2t = torch.tensor([0, 0, 1, 1, 2, 3])
    h = torch.randn(1, 4).expand(n, 4).contiguous()
    temp = torch.full((n,), 0.9)
    s = head_sample(h, w, d2t, vocab, temp, torch.arange(n), torch.full((n,), 7), 1)
    q = s.q[0]
    counts = torch.bincount(s.target_ids[:, 0], minlength=vocab).double()
    keep = q > 0
    assert float(counts[~keep].sum()) == 0.0
    p = chisquare(counts[keep].numpy(), (q[keep].double() * n).numpy()).pvalue
    assert p > 1e-4, p
    # The draws are exactly Gumbel-max with the stream-3 Philox uniforms of the spec.
    u = philox.uniform_rows(torch.arange(n), torch.full((n,), 7), STREAM_DRAFT, vocab)
    tgt = torch.arange(vd) + d2t
    mine = torch.argmax(torch.log(q[tgt])[None] - torch.log(-torch.log(u[:, tgt])), -1)
    assert torch.equal(tgt[mine], s.target_ids[:, 0])


def test_validation_errors(target):
    head = make_eagle()
    d = Eagle3Drafter(head)
    with pytest.raises(RuntimeError, match="prefill"):
        d.propose(2)
    ids, lengths, nxt = ragged_batch()
    with torch.no_grad():
        feats = capture_target_features(target, ids, head.cfg.feature_layers).eagle3_features
    with pytest.raises(ValueError, match="target_features"):
        d.prefill(ids, lengths, nxt, feats[..., :10])
    with pytest.raises(TypeError, match="target_features"):
        d.prefill(ids, lengths, nxt, None)
    with pytest.raises(ValueError, match="lengths"):
        d.prefill(ids, torch.tensor([0, 3, 3]), nxt, feats)
    with pytest.raises(ValueError, match="input_ids"):
        d.prefill(ids + V, lengths, nxt, feats)
    with pytest.raises(TypeError, match="lengths"):
        d.prefill(ids, lengths.float(), nxt, feats)
    d.prefill(ids, lengths, nxt, feats)
    with pytest.raises(ValueError, match="top_k"):
        d.propose_tree(2, 1000, 1)
    with pytest.raises(ValueError, match="depth"):
        d.propose(0)
    with pytest.raises(ValueError, match="seed"):
        d.propose(2, torch.ones(3))
    with pytest.raises(ValueError, match="temperature"):
        d.propose(2, torch.tensor([1.0, -1.0, 1.0]), torch.ones(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="num_accepted"):
        d.commit(torch.tensor([3, 0, 0]), torch.zeros(3, 3, dtype=torch.int64), torch.zeros(3, 3, 96))
    with pytest.raises(ValueError, match="output_token_ids"):
        d.commit(torch.tensor([0, 0, 0]), torch.full((3, 3), -1), torch.zeros(3, 3, 96))
    with pytest.raises(ValueError, match="backend"):
        Eagle3Drafter(head, backend="cuda")
    with pytest.raises(ValueError, match="feature_layers"):
        Eagle3Head(Eagle3Config(V, 8, 32, 32, 64, 2, 1, 16, feature_layers=(2, 2, 3)))
    with pytest.raises(ValueError, match="target_ids"):
        head.set_draft_vocab(torch.zeros(48, dtype=torch.int64))
    assert isinstance(DraftProposal(torch.zeros(1, 1), None).flat()[1], torch.Tensor)


def test_slots_admit_and_row_subsets_match_a_plain_batch(target):
    """Continuous batching (reset / admit / rows=) leaves every slot as a plain prefill would: proposals and
    commits on a subset of slots, in any order, equal those of a plain batch."""
    head = make_eagle()
    ids, lengths, nxt = ragged_batch(5)
    with torch.no_grad():
        feats = capture_target_features(target, ids, head.cfg.feature_layers).eagle3_features
    plain = Eagle3Drafter(head)
    plain.prefill(ids, lengths, nxt, feats)
    want = plain.propose_tree(3, 2, 2)
    d = Eagle3Drafter(head)
    d.reset(5)
    d.admit(torch.tensor([4, 1]), ids[[0, 2]], lengths[[0, 2]], nxt[[0, 2]], feats[[0, 2]])
    d.admit(torch.tensor([3]), ids[[1]], lengths[[1]], nxt[[1]], feats[[1]])
    rows = torch.tensor([4, 3, 1])
    got = d.propose_tree(3, 2, 2, rows=rows)
    assert torch.equal(got.node_token_ids, want.node_token_ids)
    out = torch.cat([want.node_token_ids[:, 1:3], torch.full((3, 1), 7)], 1)
    n = torch.tensor([2, 0, 1])
    feats2 = torch.randn(3, 3, 96)
    plain.commit(n, out, feats2)
    d.commit(n[[2, 0]], out[[2, 0]], feats2[[2, 0]], rows=torch.tensor([1, 4]))  # two slots, other order
    d.commit(n[[1]], out[[1]], feats2[[1]], rows=torch.tensor([3]))
    assert torch.equal(d.num_tokens[rows], plain.num_tokens)
    assert torch.equal(d.propose(3, rows=rows).token_ids, plain.propose(3).token_ids)
    temp, seed = torch.tensor([0.9, 1.0, 0.0]), torch.tensor([5, 6, 7])
    assert torch.equal(d.propose(3, temp, seed, rows=rows).token_ids, plain.propose(3, temp, seed).token_ids)
    with pytest.raises(ValueError, match="num_slots"):
        d.reset(0)


def test_chain_proposal_equals_the_one_branch_tree(target):
    """``propose`` (causal steps, one native call each when built) drafts what ``propose_tree(k, 1, 1)``
    drafts, greedy and sampled, with the torch ops and with the native step."""
    head = make_eagle()
    ids, lengths, nxt = ragged_batch(2)
    with torch.no_grad():
        feats = capture_target_features(target, ids, head.cfg.feature_layers).eagle3_features
    temp, seed = torch.tensor([1.0, 0.0, 0.7]), torch.tensor([3, 4, 5])
    for use_native in (False, None):
        d = Eagle3Drafter(head, native=use_native)
        d.prefill(ids, lengths, nxt, feats)
        for t, s in ((None, None), (temp, seed)):
            chain, tree = d.propose(4, t, s), d.propose_tree(4, 1, 1, t, s)
            assert torch.equal(chain.token_ids, tree.node_token_ids[:, 1:])
            if t is not None:
                torch.testing.assert_close(chain.probs, tree.draft_probs[:, :4], rtol=1e-4, atol=1e-6)


@pytest.mark.native
@pytest.mark.skipif(not native.has_op("philox_uniform_rows", "cpu"), reason="specdec_kernels._C not built")
def test_native_draft_uniforms_are_the_reference_philox():
    """The drafters' noise in one native call equals reference/philox.py bit for bit (every stream, extreme
    seeds and positions); bad arguments name themselves."""
    g = torch.Generator().manual_seed(0)
    seed = torch.cat([torch.randint(-2**62, 2**62, (64,), generator=g), torch.tensor([0, -1, 2**63 - 1, -2**63])])
    pos = torch.cat([torch.randint(0, 2**31, (64,), generator=g), torch.tensor([0, 2**31 - 1, 5, 7])])
    for stream in range(4):
        assert torch.equal(native.uniform_rows(seed, pos, stream, 777), philox.uniform_rows(seed, pos, stream, 777))
    with pytest.raises(ValueError, match="position"):
        native.uniform_rows(seed[:1], torch.tensor([-1]), 3, 8)
    with pytest.raises(ValueError, match="stream"):
        native.uniform_rows(seed[:1], pos[:1], 4, 8)
    with pytest.raises(TypeError, match="seed"):
        native.uniform_rows(seed[:1].int(), pos[:1], 3, 8)
