"""rl_loop.model: transformers-compatible Qwen3, cached steps, tree masks, fused inference weights."""

from __future__ import annotations

import pytest
import torch

from rl_loop.model import KVCache, ModelConfig, Qwen3, load_pretrained, save_pretrained
from rl_loop.task import CharTokenizer

pytestmark = pytest.mark.rl
torch.set_num_threads(1)  # tiny shapes: extra threads only add synchronisation overhead

CFG = ModelConfig(num_hidden_layers=2, intermediate_size=96)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Qwen3(CFG).eval()
    with torch.no_grad():  # non-trivial norms so that a swapped q/k norm would show
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return m


def test_transformers_loads_the_checkpoint_and_agrees(model, tmp_path):
    save_pretrained(model, str(tmp_path), CharTokenizer())
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    ids = torch.randint(3, 21, (2, 11))
    with torch.no_grad():
        ours, _ = model(ids)
        ref = hf(ids).logits
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    again = load_pretrained(str(tmp_path))
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)


@pytest.mark.parametrize("fused", [False, True])
def test_cached_ragged_steps_match_the_full_forward(model, fused):
    model._fused = {}
    if fused:
        model.sync_inference_weights()
    ids = torch.randint(3, 21, (3, 12))
    with torch.no_grad():
        full, _ = model(ids)
        cache = KVCache(CFG, 3, 16)
        model.step(ids[:, :7], cache, None, torch.zeros(3, dtype=torch.long), 7)
        start = torch.tensor([2, 5, 7])  # rows at different lengths: the old tail is overwritten
        new = torch.stack([ids[i, s : s + 4] for i, s in enumerate(start.tolist())])
        logits, _ = model.step(new, cache, None, start, 11)
        for i, s in enumerate(start.tolist()):
            torch.testing.assert_close(logits[i], full[i, s : s + 4], atol=1e-5, rtol=1e-5)
        # a subset of rows, selected by index
        cache2 = KVCache(CFG, 4, 16)
        rows = torch.tensor([3, 1])
        out, _ = model.step(ids[:2, :6], cache2, rows, torch.zeros(2, dtype=torch.long), 6)
        torch.testing.assert_close(out, full[:2, :6], atol=1e-5, rtol=1e-5)
    model._fused = {}


def test_fused_inference_weights_match_the_training_path(model):
    ids = torch.randint(3, 21, (2, 9))
    with torch.no_grad():
        model._fused = {}
        plain, _ = model(ids)
        model.sync_inference_weights()
        fused, _ = model(ids)
        model.train()
        train_mode, _ = model(ids)  # training never uses the fused copies
        model.eval()
    model._fused = {}
    torch.testing.assert_close(fused, plain, atol=1e-4, rtol=1e-4)
    assert torch.equal(train_mode, plain)


@pytest.mark.parametrize("fused", [False, True])
def test_tree_mask_step_matches_each_root_to_leaf_path(model, fused):
    model._fused = {}
    if fused:
        model.sync_inference_weights()
    # tree over 5 new tokens after a 4-token prefix: 0 -> {1, 2}, 1 -> 3, 2 -> 4
    parent = [-1, 0, 0, 1, 2]
    depth = torch.tensor([[0, 1, 1, 2, 2]])
    anc = torch.zeros(1, 5, 5, dtype=torch.bool)
    for i in range(5):
        j = i
        while j >= 0:
            anc[0, i, j] = True
            j = parent[j]
    prefix = torch.randint(3, 21, (1, 4))
    nodes = torch.randint(3, 21, (1, 5))
    with torch.no_grad():
        cache = KVCache(CFG, 1, 16)
        model.step(prefix, cache, None, torch.zeros(1, dtype=torch.long), 4)
        tree_logits, _ = model.step(nodes, cache, None, torch.tensor([4]), 9, depth=depth, tree_mask=anc)
        for path in ([0, 1, 3], [0, 2, 4]):
            seq = torch.cat([prefix, nodes[:, path]], 1)
            full, _ = model(seq)
            torch.testing.assert_close(tree_logits[0, path], full[0, 4:], atol=1e-5, rtol=1e-5)
    model._fused = {}


def test_kv_len_beyond_the_cache_raises(model):
    cache = KVCache(CFG, 1, 4)
    with pytest.raises(ValueError, match="kv_len"):
        model.step(torch.zeros(1, 2, dtype=torch.long), cache, None, torch.tensor([3]), 5)
