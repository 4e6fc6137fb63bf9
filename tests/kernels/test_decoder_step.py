"""Fused decoder-layer step (``specdec_kernels.native.decoder_step``) and its reference
(``specdec_kernels.reference.decoder_step``, weight packing included).

The reference on packed weights equals the Qwen3 layer of ``specdec_kernels.models`` (its cached step);
the native kernel equals the reference: logits, output hidden states and the keys/values written to the
cache agree to float32 rounding over grouped-query shapes, subsets of cache rows, ragged starts, tree-like
depths, n = 1..5 new tokens and the EAGLE-3 ``qkv_add`` input. Bad shapes and out-of-range indices raise
errors that name the argument. Every drafter kind proposes the same drafts with the native step as with
the torch ops.
"""

from __future__ import annotations

import pytest
import torch

from specdec_kernels import native
from specdec_kernels.drafters import DraftModelDrafter, Eagle3Drafter, Eagle3Head, MtpDrafter, MtpHead
from specdec_kernels.drafters.native_step import native_step_available
from specdec_kernels.models import KVCache, ModelConfig, Qwen3
from specdec_kernels.reference import decoder_step as ref

native_only = pytest.mark.skipif(not native_step_available(), reason="specdec_kernels._C not built (pip install -e .)")
pytestmark = pytest.mark.usefixtures("one_thread")


def _model(heads: int, kv_heads: int, seed: int, layers: int = 1) -> Qwen3:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, hidden_size=48, intermediate_size=80, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=32,
                      max_position_embeddings=96)
    model = Qwen3(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norms and larger activations than the 0.02 init
            p.add_(0.3 * torch.randn_like(p))
    model.sync_inference_weights()
    return model


def _case(model: Qwen3, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    batch, cache_len, reqs = 6, 40, 4
    cache = KVCache(model.config, batch, cache_len)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    rows = torch.randperm(batch, generator=gen)[:reqs]
    start = torch.randint(0, cache_len - n, (reqs,), generator=gen)
    depth = torch.randint(0, 3, (reqs, n), generator=gen).cumsum(1)  # tree-like: repeated depths allowed
    x = torch.randn(reqs, n, model.config.hidden_size, generator=gen)
    return cache, rows, start, depth, x


def _copy(cache: KVCache) -> KVCache:
    out = KVCache.__new__(KVCache)
    out.k, out.v = cache.k.clone(), cache.v.clone()
    return out


@pytest.mark.parametrize("heads,kv_heads", [(2, 1), (4, 2)])
@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.slow
def test_reference_on_packed_weights_equals_the_qwen3_layer(heads, kv_heads, n):
    model = _model(heads, kv_heads, seed=heads * 10 + n)
    cache, rows, start, depth, x = _case(model, n, seed=n)
    mine = _copy(cache)
    with torch.no_grad():
        logits, (h,) = model.step(torch.zeros(len(rows), n, dtype=torch.long), cache, rows, start,
                                  int(start.max()) + n, depth=depth, capture=(-1,), inputs_embeds=x)
    weights, rope = model.native_step_args(0)
    got_logits, got_hidden = ref.decoder_step(x, weights, mine.k[0], mine.v[0], rows, start, depth, rope, heads,
                                              model.config.rms_norm_eps)
    torch.testing.assert_close(got_logits, logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model.model.norm(got_hidden), h, rtol=1e-4, atol=1e-4)
    # the cache holds keys in the fused (interleaved) layout of the inference path, as the reference writes
    torch.testing.assert_close(mine.k, cache.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.v, cache.v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(2, 1), (4, 2), (2, 2)])
@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("with_add", [False, True])
@pytest.mark.native
@native_only
def test_native_matches_the_reference(heads, kv_heads, n, with_add):
    model = _model(heads, kv_heads, seed=heads * 10 + n)
    cache, rows, start, depth, x = _case(model, n, seed=n + 7)
    mine = _copy(cache)
    weights, rope = model.native_step_args(0)
    width = weights[1].shape[0]
    add = torch.randn(len(rows), n, width, generator=torch.Generator().manual_seed(3)) if with_add else None
    want = ref.decoder_step(x, weights, cache.k[0], cache.v[0], rows, start, depth, rope, heads, 1e-6, add)
    got = native.decoder_step(x, weights, mine.k[0], mine.v[0], rows, start, depth, rope, heads, 1e-6, add)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mine.k, cache.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.v, cache.v, rtol=1e-5, atol=1e-5)


def _args(model: Qwen3, reqs=2, n=2, batch=3, cache_len=16):
    weights, rope = model.native_step_args(0)
    return dict(
        x=torch.zeros(reqs, n, model.config.hidden_size), weights=weights,
        k_cache=torch.zeros(batch, model.config.num_key_value_heads, cache_len, model.config.head_dim),
        v_cache=torch.zeros(batch, model.config.num_key_value_heads, cache_len, model.config.head_dim),
        rows=torch.arange(reqs), start=torch.zeros(reqs, dtype=torch.long),
        depth=torch.arange(n).expand(reqs, n).contiguous(), rope=rope,
        num_heads=model.config.num_attention_heads, eps=1e-6,
    )


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(x=a["x"].double()), "x must be Float"),
    (lambda a: a.update(rows=torch.tensor([0, 3])), "rows\\[1\\] = 3 is outside the cache batch"),
    (lambda a: a.update(start=torch.tensor([0, 15])), "start\\[1\\] \\+ n = 17 exceeds the cache length"),
    (lambda a: a.update(depth=torch.tensor([[0, 1], [0, 500]])), "outside the rope table"),
    (lambda a: a.update(depth=torch.zeros(2, 3, dtype=torch.long)), "depth must have shape"),
    (lambda a: a["weights"].pop(), "weights must hold 10 tensors"),
    (lambda a: a.update(num_heads=0), "num_heads must be a positive multiple"),
    (lambda a: a.update(num_heads=3), "qkv weight must have shape"),
    (lambda a: a.update(k_cache=a["k_cache"][:, :, :8].contiguous()), "v_cache must have shape"),
    (lambda a: a.update(k_cache=a["k_cache"][:, :, :8]), "k_cache must be contiguous"),
    (lambda a: a.update(qkv_add=torch.zeros(2, 2, 5)), "qkv_add must have shape"),
])
@pytest.mark.native
@native_only
def test_bad_input_names_the_argument(change, message):
    args = _args(_model(2, 1, seed=0))
    change(args)
    with pytest.raises((ValueError, TypeError), match=message):
        native.decoder_step(**args)


def _drafters(kind: str, policy: Qwen3):
    torch.manual_seed(5)
    if kind == "eagle3":
        head = Eagle3Head.for_target(policy, intermediate_size=64, feature_layers=(0, 1, 2))
        make = lambda native_flag: Eagle3Drafter(head, native=native_flag)
    elif kind == "mtp":
        head = MtpHead.from_target(policy, intermediate_size=64)
        make = lambda native_flag: MtpDrafter(head, native=native_flag)
    else:
        lm = _model(2, 1, seed=9)
        make = lambda native_flag: DraftModelDrafter(lm, native=native_flag)
        return make
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return make


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "draft_model"])
@pytest.mark.native
@native_only
def test_every_drafter_drafts_the_same_with_the_native_step(kind):
    policy = _model(2, 1, seed=3, layers=3)
    make = _drafters(kind, policy)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (3, 7), generator=gen)
    lengths, nxt = torch.tensor([5, 3, 7]), torch.tensor([4, 9, 2])
    with torch.no_grad():
        _, hidden = policy(ids, capture=(0, 1, 2, 3))
    feats = {"eagle3": torch.cat(hidden[:3], -1), "mtp": hidden[3], "draft_model": None}[kind]
    verified = torch.randn(3, 4, feats.shape[-1], generator=gen) if feats is not None else None
    proposals = []
    for native_flag in (False, True):
        d = make(native_flag)
        d.reset(4, 32)
        assert (d.kernel is not None) == native_flag
        slots = torch.tensor([0, 2, 3])
        d.admit(slots, ids, lengths, nxt, feats)
        first = d.propose(3, rows=slots).token_ids
        n = torch.tensor([2, 0, 3])
        out = torch.cat([first, torch.full((3, 1), 4)], 1)
        out[torch.arange(3), n] = 4
        d.commit(n, out, verified, rows=slots)
        second = d.propose(3, torch.tensor([0.8, 1.0, 0.0]), torch.tensor([1, 2, 3]), rows=slots)
        proposals.append((first, second.token_ids, second.probs))
    (a1, a2, aq), (b1, b2, bq) = proposals
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    torch.testing.assert_close(aq, bq, rtol=1e-4, atol=1e-6)
