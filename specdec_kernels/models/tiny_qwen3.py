"""Tiny random Qwen3 models, built locally: :func:`tiny_qwen3` (the one builder for tests, benchmarks and
examples: a ``specdec_kernels.models.Qwen3``, or the same weights as a transformers ``Qwen3ForCausalLM``),
and checkpoints (target and a close draft) that vLLM can serve.

No model hub is reachable, so end-to-end tests build their own: a word-level tokenizer (``tokenizers``)
over tokens ``t0 .. t{V-1}`` saved as ``tokenizer.json``, and a randomly initialised
``Qwen3ForCausalLM`` saved with safetensors. The output head is scaled up so next-token distributions are
peaked (a uniform 512-way distribution would make every law test powerless and every draft rejected),
and the draft model is the target with Gaussian noise on its weights, so drafts are often accepted
without being identical to the target. A spec with ``draft_layers`` makes the draft the target's first
layers instead (same embedding, final norm and output head): a smaller model that agrees with the target
often, as :data:`QWEN3_0_6B` does at a real model's shapes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class TinyQwen3Spec:
    """Every knob of the tiny checkpoints (head_dim 64: the CPU attention backend supports it)."""

    vocab_size: int = 128
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 64
    max_position: int = 1024
    logit_scale: float = 30.0  # multiplies the output head: larger = more peaked next-token laws
    draft_noise: float = 0.1  # relative std of the noise added to every draft weight
    seed: int = 0
    num_kv_heads: int | None = None  # None: num_heads (no grouped-query attention)
    draft_layers: int | None = None  # None: the draft is the noisy target; n: the target's first n layers
    rope_theta: float = 10000.0
    embed_std: float = 1.0  # std of the token embedding: larger = later layers move the next-token law less


# Qwen3-0.6B's shapes (its config.json: V = 151936, hidden 1024, 16 query / 8 KV heads of 128, MLP 3072,
# 28 layers, rope_theta 1e6), random weights; the output head is untied (the real model ties it) so that
# the head's scale, not the embedding's, sets how peaked the next-token laws are (logit_scale 10: the top
# token holds about half the mass at T = 1). The draft is the target's first 2 layers; embed_std 4 keeps it
# close enough to the target that about half its sampled drafts are accepted (measured on 8 target layers).
# Callers reduce num_layers with dataclasses.replace and say so.
QWEN3_0_6B = TinyQwen3Spec(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                           num_heads=16, num_kv_heads=8, head_dim=128, max_position=2048, logit_scale=10.0,
                           draft_layers=2, rope_theta=1_000_000.0, embed_std=4.0)


def spread_qwen3(config, generator: torch.Generator | None = None, std: float = 0.12) -> torch.nn.Module:
    """A ``specdec_kernels.models.Qwen3`` of ``config`` with every weight but the norms drawn from
    N(0, ``std``^2) by ``generator`` (default: one seeded with 0; a caller's generator goes on from where
    the model left it): next-token distributions spread over many tokens, so sampled drafts are accepted
    at several depths and rejected often enough to tell verifiers apart."""
    from .qwen3 import Qwen3

    g = torch.Generator().manual_seed(0) if generator is None else generator
    model = Qwen3(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def tiny_qwen3(vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 4, num_heads: int = 2,
               num_kv_heads: int = 1, head_dim: int = 64, intermediate_size: int = 128, seed: int = 0,
               dtype: torch.dtype = torch.float32, max_position: int = 2048, tie_word_embeddings: bool = True,
               transformers: bool = False) -> torch.nn.Module:
    """A randomly initialised small Qwen3 in eval mode, deterministic in ``seed``: our
    :class:`~specdec_kernels.models.Qwen3`, or (``transformers=True``) a ``Qwen3ForCausalLM`` holding the
    same weights (both load each other's checkpoints; :func:`to_transformers`)."""
    from .qwen3 import ModelConfig, Qwen3

    cfg = ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                      head_dim=head_dim, max_position_embeddings=max_position,
                      tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    model = Qwen3(cfg).to(dtype).eval()
    return to_transformers(model) if transformers else model


def to_transformers(model: torch.nn.Module) -> torch.nn.Module:
    """A transformers ``Qwen3ForCausalLM`` (``LlamaForCausalLM`` without q/k norms) with ``model``'s weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = model.config.to_hf_dict()
    hf_config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    hf = AutoModelForCausalLM.from_config(hf_config).to(next(model.parameters()).dtype)
    hf.load_state_dict(model.state_dict(), strict=not model.config.tie_word_embeddings)
    return hf.eval()


def token_text(index: int) -> str:
    """Surface form of token ``index`` (prompts are space-separated token texts)."""
    return f"t{index}"


def build_tokenizer(directory: Path, vocab_size: int) -> None:
    """Write a word-level ``tokenizer.json`` (+ config) with tokens t0..t{V-1}; t0 = unk, t1 = eos."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token_text(i): i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=token_text(0)))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token=token_text(0), eos_token=token_text(1))
    fast.save_pretrained(str(directory))


def _config(spec: TinyQwen3Spec, num_layers: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads or spec.num_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position, tie_word_embeddings=False, rope_theta=spec.rope_theta,
        bos_token_id=1, eos_token_id=1, torch_dtype="float32",
    )


def build_target_and_draft(directory: Path, spec: TinyQwen3Spec = TinyQwen3Spec()) -> tuple[Path, Path]:
    """Build ``directory/target`` and ``directory/draft`` (skipped when already built with this spec).

    Returns the two checkpoint directories. Deterministic in ``spec.seed``.
    """
    from transformers import Qwen3ForCausalLM

    directory = Path(directory)
    target_dir, draft_dir = directory / "target", directory / "draft"
    stamp = json.dumps(spec.__dict__, sort_keys=True)
    stamp_file = directory / "spec.json"
    if stamp_file.exists() and stamp_file.read_text() == stamp:
        return target_dir, draft_dir
    torch.manual_seed(spec.seed)
    target = Qwen3ForCausalLM(_config(spec, spec.num_layers)).float().eval()
    with torch.no_grad():
        target.model.embed_tokens.weight.normal_(0.0, spec.embed_std)
        target.lm_head.weight.mul_(spec.logit_scale)
    if spec.draft_layers is not None:
        if not 1 <= spec.draft_layers < spec.num_layers:
            raise ValueError(f"draft_layers must be in [1, {spec.num_layers}), got {spec.draft_layers}")
        draft = Qwen3ForCausalLM(_config(spec, spec.draft_layers)).float().eval()
        # strict: the draft's every tensor is the target's of the same name (its first layers)
        draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in draft.state_dict()})
    else:
        draft = Qwen3ForCausalLM(_config(spec, spec.num_layers)).float().eval()
        generator = torch.Generator().manual_seed(spec.seed + 1)
        with torch.no_grad():
            for (name, p_draft), p_target in zip(draft.named_parameters(), target.parameters(), strict=True):
                noise = torch.randn(p_target.shape, generator=generator) * spec.draft_noise
                scale = p_target.abs().mean() if "norm" not in name else 0.0
                p_draft.copy_(p_target + noise * scale)
    for model, path in ((target, target_dir), (draft, draft_dir)):
        model.save_pretrained(str(path), safe_serialization=True)
        build_tokenizer(path, spec.vocab_size)
    stamp_file.write_text(stamp)
    return target_dir, draft_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the tiny random Qwen3 target and draft checkpoints.")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    target, draft = build_target_and_draft(args.directory)
    print(target, draft)


if __name__ == "__main__":
    main()
