"""Save and load EAGLE-3 heads in the layout vLLM serves as an ``eagle3`` speculator.

A checkpoint is a directory with ``config.json`` and ``model.safetensors``. The config is vLLM's
``Eagle3Qwen3ForCausalLM`` (a Qwen3 midlayer with q/k norms, ``model_type`` qwen3; the default) or
``LlamaForCausalLMEagle3`` (``qk_norm=False``): the layer fields plus ``draft_vocab_size``,
``target_hidden_size``, ``fc_norm`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``. The weights are
``fc.weight``, ``fc_norm.{i}.weight``, ``midlayer.*`` (one decoder layer with ``hidden_norm`` and a
2H-wide q/k/v input), ``norm.weight``, ``lm_head.weight`` [Vd, H], ``d2t`` [Vd] int64 (target id = draft id +
d2t) and ``t2d`` [V] bool (both omitted when the draft vocabulary is the target's). The token embedding
is not saved: the server shares the target's.
``policy_version`` (the policy weights the head was synced with) is recorded in the config.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .eagle3 import Eagle3Config, Eagle3Head

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
ARCHITECTURES = {True: "Eagle3Qwen3ForCausalLM", False: "LlamaForCausalLMEagle3"}  # keyed by qk_norm


def eagle3_config_dict(head: Eagle3Head, max_position_embeddings: int | None = None,
                       policy_version: int | None = None) -> dict:
    """The vLLM/transformers config of ``head`` (``Eagle3Qwen3ForCausalLM`` or ``LlamaForCausalLMEagle3``)."""
    c = head.cfg
    max_position_embeddings = max_position_embeddings or c.max_position_embeddings
    dtype = str(head.fc.weight.dtype).replace("torch.", "")
    return {
        "architectures": [ARCHITECTURES[c.qk_norm]],
        "model_type": "qwen3" if c.qk_norm else "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": c.vocab_size,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "fc_norm": c.fc_norm,
        "torch_dtype": dtype,
        "dtype": dtype,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(c.feature_layers),
            "use_aux_hidden_state": True,
        },
        "specdec_kernels": {"policy_version": policy_version, "format": 1},
    }


def save_eagle3(head: Eagle3Head, path: str | Path, max_position_embeddings: int | None = None,
                policy_version: int | None = None) -> Path:
    """Write ``head`` to directory ``path`` (created) in vLLM's EAGLE-3 layout; returns the path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    full_vocab = head.cfg.draft_vocab_size == head.cfg.vocab_size  # d2t = 0: vLLM then has no mapping to load
    for name, t in head.state_dict().items():
        if name.startswith("embed_tokens.") or (full_vocab and name in ("d2t", "t2d")):
            continue
        tensors[name] = t.detach().contiguous().cpu()
    save_file(tensors, str(path / WEIGHTS_NAME))
    with open(path / CONFIG_NAME, "w") as f:
        json.dump(eagle3_config_dict(head, max_position_embeddings, policy_version), f, indent=2)
    return path


def load_eagle3(path: str | Path, embed_tokens: torch.Tensor | None = None) -> Eagle3Head:
    """Read a head written by :func:`save_eagle3` (or any checkpoint in the same layout).

    ``embed_tokens`` [V, H]: the target's embedding to share (zeros if None; set it later by weight sync).
    Accepts ``layers.0.`` as well as ``midlayer.`` prefixes.
    """
    from safetensors.torch import load_file

    path = Path(path)
    with open(path / CONFIG_NAME) as f:
        cfg = json.load(f)
    archs = set(cfg.get("architectures") or [])
    qwen3 = bool(archs & {"Eagle3Qwen3ForCausalLM", "Qwen3ForCausalLM"})
    if not qwen3 and not archs & {"LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM"}:
        raise ValueError(f"{path} is not an EAGLE-3 Qwen3 / Llama checkpoint (architectures={sorted(archs)})")
    tensors = load_file(str(path / WEIGHTS_NAME))
    tensors = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v
               for k, v in tensors.items()}
    eagle = cfg.get("eagle_config") or {}
    layers = tuple(eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
                   or (0, 0, 0))
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    econf = Eagle3Config(
        vocab_size=cfg["vocab_size"], draft_vocab_size=cfg.get("draft_vocab_size") or cfg["vocab_size"],
        hidden_size=hidden, target_hidden_size=cfg.get("target_hidden_size", hidden),
        intermediate_size=cfg["intermediate_size"], num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads), head_dim=cfg.get("head_dim") or hidden // heads,
        feature_layers=layers, rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
        fc_norm=bool(cfg.get("fc_norm", False)), qk_norm=qwen3,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096))
    head = Eagle3Head(econf).to(tensors["fc.weight"].dtype)
    if "d2t" not in tensors:
        tensors["d2t"] = torch.zeros(econf.draft_vocab_size, dtype=torch.int64)
    if "t2d" not in tensors:
        t2d = torch.zeros(econf.vocab_size, dtype=torch.bool)
        t2d[torch.arange(econf.draft_vocab_size) + tensors["d2t"]] = True
        tensors["t2d"] = t2d
    tensors["embed_tokens.weight"] = (embed_tokens if embed_tokens is not None
                                      else head.embed_tokens.weight.detach().new_zeros(econf.vocab_size, hidden))
    head.load_state_dict({k: v for k, v in tensors.items()}, strict=True)
    head.eval()
    return head
