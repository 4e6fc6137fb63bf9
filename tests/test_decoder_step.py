"""Fused decoder-layer step (specdec_kernels.native.decoder_step): the drafter head's step in one call.

Judged against the torch implementation of the same layer (rl_loop.model.Qwen3.step on a one-layer
model): logits, output hidden states and the keys/values written to the cache agree to float32 rounding
over grouped-query shapes, subsets of cache rows, ragged starts, tree-like depths and n = 1..5 new tokens.
Bad shapes and out-of-range indices raise errors that name the argument. The EAGLE-3 drafter proposes
the same drafts with the kernel as with the torch path.
"""

from __future__ import annotations

import pytest
import torch

from rl_loop.drafters import Eagle3Drafter, Eagle3Head, native_head_available
from rl_loop.model import KVCache, ModelConfig, Qwen3
from specdec_kernels import native

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(not native_head_available(), reason="specdec_kernels._C not built (pip install -e .)"),
]


def _model(heads: int, kv_heads: int, seed: int) -> Qwen3:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, hidden_size=48, intermediate_size=80, num_hidden_layers=1,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=32,
                      max_position_embeddings=96)
    model = Qwen3(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # non-trivial norms and larger activations than the 0.02 init
            p.add_(0.3 * torch.randn_like(p))
    model.sync_inference_weights()
    return model


@pytest.mark.parametrize("heads,kv_heads", [(2, 1), (4, 2), (2, 2)])
@pytest.mark.parametrize("n", [1, 3, 5])
def test_matches_torch_layer(heads, kv_heads, n):
    model = _model(heads, kv_heads, seed=heads * 10 + n)
    gen = torch.Generator().manual_seed(n)
    batch, cache_len, reqs = 6, 40, 4
    ref_cache = KVCache(model.config, batch, cache_len)
    ref_cache.k.normal_(generator=gen)
    ref_cache.v.normal_(generator=gen)
    cache = KVCache(model.config, batch, cache_len)
    cache.k.copy_(ref_cache.k)
    cache.v.copy_(ref_cache.v)
    rows = torch.randperm(batch, generator=gen)[:reqs]
    start = torch.randint(0, cache_len - n, (reqs,), generator=gen)
    depth = torch.randint(0, 3, (reqs, n), generator=gen).cumsum(1)  # tree-like: repeated depths allowed
    x = torch.randn(reqs, n, model.config.hidden_size, generator=gen)
    with torch.no_grad():
        ref_logits, (ref_hidden,) = model.step(torch.zeros(reqs, n, dtype=torch.long), ref_cache, rows, start,
                                               int(start.max()) + n, depth=depth, hidden_layers=(0,),
                                               inputs_embeds=x)
    weights, rope = model.native_step_args(0)
    logits, hidden = native.decoder_step(x, weights, cache.k[0], cache.v[0], rows, start, depth, rope,
                                         heads, model.config.rms_norm_eps)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hidden, ref_hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache.k, ref_cache.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cache.v, ref_cache.v, rtol=1e-5, atol=1e-5)


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
])
def test_bad_input_names_the_argument(change, message):
    args = _args(_model(2, 1, seed=0))
    change(args)
    with pytest.raises((ValueError, TypeError), match=message):
        native.decoder_step(**args)


def test_eagle3_drafter_same_drafts_native_and_torch():
    policy = _model(2, 1, seed=3)
    policy = Qwen3(ModelConfig(**{**policy.config.__dict__, "num_hidden_layers": 3})).eval()
    head = Eagle3Head(policy.config, (0, 1, 2))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.2 * torch.randn_like(p))
    drafters = [Eagle3Drafter(head, native=flag) for flag in (False, True)]
    prompts = [[1, 5, 7, 9, 4], [1, 6, 2], [1, 3, 3, 8, 8, 2, 5]]
    gen = torch.Generator().manual_seed(0)
    hidden = [torch.randn(3, 6, policy.config.hidden_size, generator=gen) for _ in range(3)]
    proposals = []
    for d in drafters:
        d.reset(num_slots=4, max_len=32)
        assert (d.kernel is not None) == d.native
        d.admit([0, 2, 3], prompts, hidden)
        slots = torch.tensor([0, 2, 3])
        first = d.propose(slots, 3, torch.zeros(3), torch.Generator().manual_seed(1))[0]
        d.commit(slots, [2, 0, 3], [[int(t) for t in row[:a]] + [4] for row, a in zip(first, [2, 0, 3], strict=True)],
                 [torch.randn(3, 4, policy.config.hidden_size, generator=torch.Generator().manual_seed(2))
                  for _ in range(3)])
        second = d.propose(slots, 3, torch.zeros(3), torch.Generator().manual_seed(1))[0]
        proposals.append((first, second, d.length.clone()))
    for a, b in zip(*proposals, strict=True):
        assert torch.equal(a, b)
