"""specdec_kernels.models.Qwen3 (the one Qwen3 stack of the policy, draft models and drafter heads):
transformers-compatible checkpoints, cached steps, tree masks, fused inference weights, feature capture."""

from __future__ import annotations

import pytest
import torch

from specdec_kernels.models import KVCache, ModelConfig, Qwen3, load_pretrained, save_pretrained
from specdec_kernels.models.tiny_qwen3 import tiny_qwen3, to_transformers

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = ModelConfig(num_hidden_layers=2, intermediate_size=96)


def _perturbed(model: Qwen3) -> Qwen3:
    with torch.no_grad():  # non-trivial norms so that a swapped q/k norm would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _perturbed(Qwen3(CFG))


def _mode(model: Qwen3, fused: bool) -> None:
    """Eval mode with (``sync_inference_weights``) or without the fused copies (``train()`` drops them)."""
    model.train().eval()
    if fused:
        model.sync_inference_weights()


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.slow
def test_transformers_loads_the_checkpoint_and_agrees(tmp_path, qk_norm):
    torch.manual_seed(1)
    ours = _perturbed(Qwen3(ModelConfig(num_hidden_layers=2, intermediate_size=96, qk_norm=qk_norm)))
    save_pretrained(ours, str(tmp_path))
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert type(hf).__name__ == ("Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM")
    ids = torch.randint(3, 21, (2, 11))
    with torch.no_grad():
        logits, hidden = ours(ids, capture=(0, 1, 2, -1))
        ref = hf(ids, output_hidden_states=True)
    torch.testing.assert_close(logits, ref.logits, atol=1e-4, rtol=1e-4)
    for mine, theirs in zip(hidden, (*ref.hidden_states, ref.hidden_states[-1]), strict=True):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)  # hidden_states indexing
    again = load_pretrained(str(tmp_path))
    for (n1, p1), (n2, p2) in zip(ours.state_dict().items(), again.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(p1, p2)
    copied = Qwen3.from_transformers(hf)
    assert all(torch.equal(p, copied.state_dict()[n]) for n, p in ours.state_dict().items())


@pytest.mark.slow
def test_tiny_builder_gives_the_same_weights_both_ways():
    ours = tiny_qwen3(vocab_size=40, hidden_size=32, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=16, seed=4)
    hf = tiny_qwen3(vocab_size=40, hidden_size=32, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=16, seed=4,
                    transformers=True)
    ids = torch.randint(0, 40, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], hf(ids).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(ids)[0], to_transformers(ours)(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True])
def test_cached_ragged_steps_match_the_full_forward(model, fused):
    _mode(model, fused)
    ids = torch.randint(3, 21, (3, 12))
    with torch.no_grad():
        full, feats = model(ids, capture=(1,))
        cache = KVCache(CFG, 3, 16)
        model.step(ids[:, :7], cache, None, torch.zeros(3, dtype=torch.long), 7)
        start = torch.tensor([2, 5, 7])  # rows at different lengths: the old tail is overwritten
        new = torch.stack([ids[i, s : s + 4] for i, s in enumerate(start.tolist())])
        logits, (h,) = model.step(new, cache, None, start, 11, capture=(1,))
        for i, s in enumerate(start.tolist()):
            torch.testing.assert_close(logits[i], full[i, s : s + 4], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(h[i], feats[0][i, s : s + 4], atol=1e-5, rtol=1e-5)
        # a subset of rows, selected by index
        cache2 = KVCache(CFG, 4, 16)
        rows = torch.tensor([3, 1])
        out, _ = model.step(ids[:2, :6], cache2, rows, torch.zeros(2, dtype=torch.long), 6)
        torch.testing.assert_close(out, full[:2, :6], atol=1e-5, rtol=1e-5)
    _mode(model, False)


def test_fused_inference_weights_match_the_training_path(model):
    ids = torch.randint(3, 21, (2, 9))
    with torch.no_grad():
        _mode(model, False)
        plain, _ = model(ids)
        model.sync_inference_weights()
        assert model.inference
        fused, _ = model(ids)
        model.train()
        train_mode, _ = model(ids)  # training never uses the fused copies ...
        model.eval()
        assert not model.inference  # ... and entering training mode dropped them (they would be stale)
    torch.testing.assert_close(fused, plain, atol=1e-4, rtol=1e-4)
    assert torch.equal(train_mode, plain)


@pytest.mark.parametrize("fused", [False, True])
def test_tree_mask_step_matches_each_root_to_leaf_path(model, fused):
    _mode(model, fused)
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
    _mode(model, False)


def test_bad_arguments_raise(model):
    cache = KVCache(CFG, 1, 4)
    with pytest.raises(ValueError, match="kv_len"):
        model.step(torch.zeros(1, 2, dtype=torch.long), cache, None, torch.tensor([3]), 5)
    with pytest.raises(ValueError, match="capture"):
        model(torch.zeros(1, 2, dtype=torch.long), capture=(3,))
    with pytest.raises(ValueError, match="head_dim"):
        ModelConfig(head_dim=3)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        ModelConfig(num_attention_heads=3, num_key_value_heads=2)
