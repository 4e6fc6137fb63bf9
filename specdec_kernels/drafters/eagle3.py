"""EAGLE-3 drafter head.

Inputs per row t: the target's residual stream at the inputs of three target layers (captured features,
``[3 * Ht]``, see ``features.py``) and the token at t + 1. The head

1. RMSNorms each of the three feature chunks (``fc_norm``, vLLM's ``fc_norm`` option), concatenates and
   projects them with ``fc`` (3 Ht -> H);
2. concatenates ``input_layernorm(embed(token))`` with ``hidden_norm(h)`` (2H) and runs one Llama-style
   decoder layer (``midlayer``) whose residual is ``h``, attending over its own KV cache;
3. applies the final ``norm`` and ``lm_head`` over a reduced draft vocabulary of Vd tokens; draft id i is
   target id ``i + d2t[i]``; ``t2d`` [V] marks target ids in the draft vocabulary.

Speculative steps after the first feed the head's own pre-norm output back in place of ``fc(features)``.
Parameter names and shapes are those of vLLM's ``LlamaForCausalLMEagle3`` checkpoints (see
``checkpoint.py``). The token embedding is the target's (shared, refreshed by weight sync).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from .cached import CachedDrafter
from .head_ops import fuse_features
from .layers import DecoderLayer, KVCache, LayerConfig, RMSNorm


def default_feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default capture points (2, L // 2, L - 3), strictly increasing.

    Servers capture the features in increasing layer order and once per layer, so the points must be
    distinct: when the default collides (tiny targets, L < 7) three evenly spread layers
    ``round(i * (L - 1) / 2)`` are used instead; targets with fewer than 3 layers cannot host EAGLE-3.
    """
    if num_target_layers < 3:
        raise ValueError(f"num_target_layers must be >= 3 for EAGLE-3, got {num_target_layers}")
    layers = (2, num_target_layers // 2, num_target_layers - 3)
    if not layers[0] < layers[1] < layers[2]:
        layers = tuple(int(round(i * (num_target_layers - 1) / 2)) for i in range(3))
    return layers


@dataclass
class Eagle3Config:
    """Every knob of an EAGLE-3 head. ``feature_layers`` index the target layers whose inputs are captured."""

    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    target_hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    feature_layers: tuple[int, ...] = (0, 1, 2)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    fc_norm: bool = True

    def to_dict(self) -> dict:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        return d


class Eagle3Head(nn.Module):
    """The EAGLE-3 head's parameters and its one-step forward over cached rows (see module docstring)."""

    uses_features = True
    num_layers = 1

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        if cfg.draft_vocab_size > cfg.vocab_size:
            raise ValueError("draft_vocab_size must be <= vocab_size")
        fl = tuple(cfg.feature_layers)
        if any(b <= a for a, b in zip(fl, fl[1:], strict=False)) or (fl and fl[0] < 0):
            raise ValueError(f"feature_layers must be non-negative and strictly increasing, got {fl}")
        if cfg.num_heads % cfg.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.feature_size = len(cfg.feature_layers) * cfg.target_hidden_size
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)  # shared with the target
        self.fc_norm = nn.ModuleList(
            [RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in cfg.feature_layers]
        ) if cfg.fc_norm else None
        self.fc = nn.Linear(self.feature_size, h, bias=False)
        lc = LayerConfig(h, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.rms_norm_eps, cfg.rope_theta)
        self.midlayer = DecoderLayer(lc, input_size=2 * h)
        self.midlayer.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        self.set_draft_vocab(torch.arange(cfg.draft_vocab_size))

    def set_draft_vocab(self, target_ids: torch.Tensor) -> None:
        """Use the sorted, distinct ``target_ids`` [Vd] as the draft vocabulary (fills d2t and t2d)."""
        ids = torch.as_tensor(target_ids, dtype=torch.int64, device=self.d2t.device)
        if ids.shape != (self.cfg.draft_vocab_size,):
            raise ValueError(f"target_ids must have shape [{self.cfg.draft_vocab_size}], got {list(ids.shape)}")
        ids = torch.sort(ids).values
        if bool((ids[1:] == ids[:-1]).any()) or bool((ids < 0).any()) or bool((ids >= self.vocab_size).any()):
            raise ValueError(f"target_ids must be distinct ids in [0, {self.vocab_size})")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def draft_to_target(self) -> torch.Tensor:
        """[Vd] int64 target id of every draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def project_features(self, features: torch.Tensor, backend: str = "torch") -> torch.Tensor:
        """[..., 3 Ht] captured features -> [..., H] (per-chunk RMSNorm + fc)."""
        lead = features.shape[:-1]
        norms = None
        if self.fc_norm is not None:
            norms = torch.stack([n.weight for n in self.fc_norm])
        out = fuse_features(features.reshape(-1, features.shape[-1]), norms, self.fc.weight,
                            self.cfg.rms_norm_eps, backend)
        return out.view(*lead, -1)

    def _layer_input(self, token_ids: torch.Tensor, hidden_in: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(token_ids).to(hidden_in.dtype)
        layer = self.midlayer
        return torch.cat([layer.input_layernorm(e), layer.hidden_norm(hidden_in)], dim=-1)

    def step(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, positions: torch.Tensor,
             slots: torch.Tensor, mask: torch.Tensor, kv: KVCache, backend: str = "torch"
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One cached step over rows [B, M]: returns (pre-norm output, normed output), each [B, M, H]."""
        x = self._layer_input(token_ids, hidden_in)
        h = self.midlayer(x, hidden_in, positions, slots, mask, kv, 0)
        return h, self.norm(h)

    def forward_train(self, token_ids: torch.Tensor, hidden_in: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]
                      ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Differentiable step (no cache): (pre-norm output, draft logits [B, M, Vd] float32, new K/V)."""
        x = self._layer_input(token_ids, hidden_in)
        h, kv = self.midlayer.forward_train(x, hidden_in, positions, mask, past)
        return h, self.lm_head(self.norm(h)).float(), kv


class Eagle3Drafter(CachedDrafter):
    """An :class:`Eagle3Head` driven through the batched drafter protocol (``base.Drafter``)."""

    def __init__(self, head: Eagle3Head, backend: str = "torch") -> None:
        super().__init__(head, backend)
