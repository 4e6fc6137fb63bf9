"""Run a causal-LM target and capture what the drafters consume: ``specdec_kernels.models.Qwen3`` or a
transformers model (e.g. ``Qwen3ForCausalLM``), with the same indexing (``hidden_states``).

- EAGLE-3 features: the residual stream at the *inputs* of ``feature_layers`` (``hidden_states[i]`` of
  ``output_hidden_states``; index 0 is the embedding output), concatenated -> [B, L, 3 Ht]. vLLM captures
  the same tensors (``hidden_states + residual`` before layer i).
- MTP features: the target's final hidden state (after its final norm, as vLLM hands it to MTP heads).

The capture adds no cost beyond ``output_hidden_states`` and detaches nothing: callers that train a
drafter on these tensors must detach them (``training.py`` does), so no gradient reaches the target.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class TargetForward(NamedTuple):
    logits: torch.Tensor  # [B, L, V]
    eagle3_features: torch.Tensor | None  # [B, L, len(feature_layers) * Ht] or None
    last_hidden: torch.Tensor  # [B, L, Ht] final (normed) hidden state, the MTP feature
    outputs: Any  # the model's full output (past_key_values etc.)


def num_layers(model: torch.nn.Module) -> int:
    """Number of decoder layers of a transformers causal LM."""
    return int(model.config.num_hidden_layers)


def capture_target_features(model: torch.nn.Module, input_ids: torch.Tensor,
                            feature_layers: tuple[int, ...] | None = None,
                            **model_kwargs: Any) -> TargetForward:
    """Forward ``model`` on ``input_ids`` [B, L] and return logits plus the drafters' features.

    ``feature_layers``: target layer indices whose inputs are captured for EAGLE-3 (None: skip). Extra
    keyword arguments (``attention_mask``, ``past_key_values``, ``position_ids``, ``use_cache`` ...) go to
    the model unchanged, so the capture works for prefill and for incremental verification steps.
    """
    from ..models.qwen3 import Qwen3

    n = num_layers(model)
    if feature_layers is not None:
        for i in feature_layers:
            if not 0 <= int(i) < n:
                raise ValueError(f"feature_layers must be in [0, {n}), got {tuple(feature_layers)}")
    if isinstance(model, Qwen3):  # keyword arguments are transformers-only (right padding is harmless)
        layers = tuple(int(i) for i in feature_layers or ())
        logits, hidden = model(input_ids, capture=layers + (n,))
        feats = torch.cat(hidden[:-1], dim=-1) if feature_layers is not None else None
        return TargetForward(logits, feats, hidden[-1], None)
    out = model(input_ids=input_ids, output_hidden_states=True, **model_kwargs)
    hs = out.hidden_states
    feats = None
    if feature_layers is not None:
        feats = torch.cat([hs[int(i)] for i in feature_layers], dim=-1)
    return TargetForward(out.logits, feats, hs[-1], out)
