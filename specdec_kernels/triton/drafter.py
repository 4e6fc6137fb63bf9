"""Fused Triton kernels for drafter heads (spec: ``specdec_kernels/reference/drafter.py``).

- :func:`fused_norm_fc`: per-chunk RMSNorm of the captured features and the ``fc`` projection in one
  kernel (the normalised features never touch memory).
- :func:`lm_head_topk`: ``lm_head`` GEMM tiles over the draft vocabulary with an online log-sum-exp and a
  per-tile top-k; only ``[R, n_tiles, k]`` candidates are written (never the [R, Vd] logits), merged by a
  tiny torch epilogue, ids mapped through ``d2t``.
- :func:`lm_head_sample`: the same tiles with temperature and Gumbel noise on Philox stream 3, draw index
  = target id (``gumbel.uniform``, bit-identical to ``reference/philox.py``); the scaled logits are written
  straight into the target-vocabulary q row, normalised in place by a second kernel.

Inputs are assumed validated by the callers in ``drafters/head_ops.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..reference.philox import STREAM_DRAFT
from . import gumbel

# A compiled kernel reads module globals only as constexpr (the interpreter reads any).
_STREAM_DRAFT = tl.constexpr(STREAM_DRAFT)


@dataclass(frozen=True)
class DrafterKernelConfig:
    """Tile sizes (tl.dot needs every dimension >= 16)."""

    block_rows: int = 16
    block_out: int = 32
    block_k: int = 32
    block_vocab: int = 64


CONFIG = DrafterKernelConfig()


# ---------------------------------------------------------------------------------------------------
# per-chunk RMSNorm + fc
# ---------------------------------------------------------------------------------------------------

@triton.jit
def _norm_fc_kernel(x_ptr, nw_ptr, w_ptr, out_ptr, R, HT, N, eps,
                    C: tl.constexpr, HAS_NORM: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < R
    nmask = cols < N
    kk = tl.arange(0, BLOCK_K)
    K = C * HT
    # Pass 1: inverse RMS of every (row, chunk), kept as C columns of a [BLOCK_R, C_PAD] tile.
    cidx = tl.arange(0, 4 if C <= 4 else 8)
    inv = tl.zeros((BLOCK_R, 4 if C <= 4 else 8), dtype=tl.float32)
    if HAS_NORM:
        for c in tl.static_range(C):
            ss = tl.zeros((BLOCK_R,), dtype=tl.float32)
            for k0 in range(0, HT, BLOCK_K):
                km = (k0 + kk) < HT
                x = tl.load(x_ptr + rows[:, None] * K + c * HT + k0 + kk[None, :],
                            mask=rmask[:, None] & km[None, :], other=0.0).to(tl.float32)
                ss += tl.sum(x * x, axis=1)
            r = 1.0 / tl.sqrt(ss / HT + eps)
            inv = tl.where(cidx[None, :] == c, r[:, None], inv)
    # Pass 2: GEMM over K with the normalisation applied on the fly.
    acc = tl.zeros((BLOCK_R, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + kk
        km = k < K
        x = tl.load(x_ptr + rows[:, None] * K + k[None, :], mask=rmask[:, None] & km[None, :],
                    other=0.0).to(tl.float32)
        if HAS_NORM:
            chunk = k // HT
            scale = tl.zeros((BLOCK_R, BLOCK_K), dtype=tl.float32)
            for c in tl.static_range(C):
                col = tl.sum(tl.where(cidx[None, :] == c, inv, 0.0), axis=1)
                scale = tl.where((chunk == c)[None, :], col[:, None], scale)
            nw = tl.load(nw_ptr + k, mask=km, other=0.0).to(tl.float32)
            x = x * scale * nw[None, :]
        w = tl.load(w_ptr + cols[None, :] * K + k[:, None], mask=km[:, None] & nmask[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.dot(x, w, input_precision="ieee")
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=rmask[:, None] & nmask[None, :])


def fused_norm_fc(features: torch.Tensor, norm_weights: torch.Tensor | None, fc_weight: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """[R, C*Ht] -> [R, H] = fc(concat_c RMSNorm_c(chunk_c)); output in ``fc_weight``'s dtype."""
    x = features.contiguous()
    w = fc_weight.contiguous()
    r, k = x.shape
    n = w.shape[0]
    c = 1 if norm_weights is None else norm_weights.shape[0]
    ht = k // c
    out = torch.empty(r, n, dtype=w.dtype, device=x.device)
    nw = w if norm_weights is None else norm_weights.contiguous().reshape(-1)
    cfg = CONFIG
    grid = (triton.cdiv(r, cfg.block_rows), triton.cdiv(n, cfg.block_out))
    _norm_fc_kernel[grid](x, nw, w, out, r, ht, n, eps, C=c, HAS_NORM=norm_weights is not None,
                          BLOCK_R=cfg.block_rows, BLOCK_N=cfg.block_out, BLOCK_K=cfg.block_k)
    return out


# ---------------------------------------------------------------------------------------------------
# lm_head tiles: online log-sum-exp + per-tile top-k (optionally Gumbel-perturbed), q row written
# ---------------------------------------------------------------------------------------------------

@triton.jit
def _head_tile_kernel(h_ptr, w_ptr, d2t_ptr, temp_ptr, seed_ptr, pos_ptr,
                      z_ptr, cand_val_ptr, cand_idx_ptr, tile_max_ptr, tile_sum_ptr,
                      R, H, VD, V, NT,
                      K: tl.constexpr, SAMPLE: tl.constexpr, WRITE_Z: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_r = tl.program_id(0)
    pid_v = tl.program_id(1)
    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < R
    vmask = cols < VD
    kk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_R, BLOCK_V), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + kk
        km = k < H
        x = tl.load(h_ptr + rows[:, None] * H + k[None, :], mask=rmask[:, None] & km[None, :], other=0.0)
        w = tl.load(w_ptr + cols[None, :] * H + k[:, None], mask=km[:, None] & vmask[None, :], other=0.0)
        acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
    tgt = cols + tl.load(d2t_ptr + cols, mask=vmask, other=0)
    valid = rmask[:, None] & vmask[None, :]
    if SAMPLE:
        t = tl.load(temp_ptr + rows, mask=rmask, other=1.0)
        greedy = t <= 0.0
        z = acc / tl.where(greedy, 1.0, t)[:, None]
    else:
        z = acc
    z = tl.where(valid, z, float("-inf"))
    m = tl.max(z, axis=1)
    m_safe = tl.where(m == float("-inf"), 0.0, m)  # padded rows: avoid -inf - -inf
    s = tl.sum(tl.where(valid, tl.exp(z - m_safe[:, None]), 0.0), axis=1)
    tl.store(tile_max_ptr + rows * NT + pid_v, m, mask=rmask)
    tl.store(tile_sum_ptr + rows * NT + pid_v, s, mask=rmask)
    if WRITE_Z:
        tl.store(z_ptr + rows[:, None].to(tl.int64) * V + tgt[None, :], z, mask=valid)
    score = z
    if SAMPLE:
        seed = tl.load(seed_ptr + rows, mask=rmask, other=0)
        pos = tl.load(pos_ptr + rows, mask=rmask, other=0)
        offset_base = (pos[:, None].to(tl.int64) << 32) | (_STREAM_DRAFT << 30)
        u = gumbel.uniform(seed[:, None], offset_base, tgt[None, :].to(tl.int64))
        noise = -tl.log(-tl.log(u))
        score = tl.where(greedy[:, None], z, z + noise)
        score = tl.where(valid, score, float("-inf"))
    for j in tl.static_range(K):
        best = tl.max(score, axis=1)
        idx = tl.min(tl.where(score == best[:, None], cols[None, :], 2147483647), axis=1)
        base = (rows * NT + pid_v) * K + j
        tl.store(cand_val_ptr + base, best, mask=rmask)
        tl.store(cand_idx_ptr + base, idx, mask=rmask)
        score = tl.where(cols[None, :] == idx[:, None], float("-inf"), score)


@triton.jit
def _normalise_q_kernel(q_ptr, lse_ptr, d2t_ptr, VD, V, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = cols < VD
    tgt = cols + tl.load(d2t_ptr + cols, mask=vmask, other=0)
    ptr = q_ptr + row.to(tl.int64) * V + tgt
    z = tl.load(ptr, mask=vmask, other=float("-inf"))
    lse = tl.load(lse_ptr + row)
    tl.store(ptr, tl.exp(z - lse), mask=vmask)


def _tiles(hidden: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor, k: int, vocab_size: int,
           temperature: torch.Tensor | None, seed: torch.Tensor | None, position: torch.Tensor | None,
           q: torch.Tensor | None):
    cfg = CONFIG
    h = hidden.contiguous()
    w = lm_head.contiguous()
    r, hd = h.shape
    vd = w.shape[0]
    nt = triton.cdiv(vd, cfg.block_vocab)
    k_tile = min(k, cfg.block_vocab)
    dev = h.device
    cand_val = torch.empty(r, nt, k_tile, dtype=torch.float32, device=dev)
    cand_idx = torch.empty(r, nt, k_tile, dtype=torch.int32, device=dev)
    tmax = torch.empty(r, nt, dtype=torch.float32, device=dev)
    tsum = torch.empty(r, nt, dtype=torch.float32, device=dev)
    sample = temperature is not None
    dummy = cand_val
    grid = (triton.cdiv(r, cfg.block_rows), nt)
    _head_tile_kernel[grid](
        h, w, d2t.contiguous(),
        temperature.contiguous() if sample else dummy,
        seed.contiguous() if sample else dummy,
        position.contiguous() if sample else dummy,
        q if q is not None else dummy, cand_val, cand_idx, tmax, tsum,
        r, hd, vd, vocab_size, nt,
        K=k_tile, SAMPLE=sample, WRITE_Z=q is not None,
        BLOCK_R=cfg.block_rows, BLOCK_V=cfg.block_vocab, BLOCK_K=cfg.block_k)
    gmax = tmax.max(dim=1, keepdim=True).values
    lse = (gmax + torch.log((tsum * torch.exp(tmax - gmax)).sum(dim=1, keepdim=True))).squeeze(1)
    # Candidates are in (tile, rank) order = increasing draft id among equal scores, so a stable sort
    # on the score keeps ties at the lowest id, as the reference does.
    vals, order = torch.sort(cand_val.reshape(r, -1), dim=1, descending=True, stable=True)
    idx = cand_idx.reshape(r, -1).gather(1, order[:, :k]).to(torch.int64)
    return vals[:, :k], idx, lse


def lm_head_topk(hidden: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(target ids [R, k] int64, log-softmax values [R, k] float32) of the top-k draft tokens."""
    vals, idx, lse = _tiles(hidden, lm_head, d2t, k, 0, None, None, None, None)
    return idx + d2t[idx], vals - lse[:, None]


def lm_head_sample(hidden: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor, vocab_size: int,
                   temperature: torch.Tensor, seed: torch.Tensor, position: torch.Tensor, k: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(target ids [R, k], log q of them [R, k], q [R, V]) drawn by Gumbel-top-k on Philox stream 3."""
    r = hidden.shape[0]
    q = torch.zeros(r, vocab_size, dtype=torch.float32, device=hidden.device)
    _, idx, lse = _tiles(hidden, lm_head, d2t, k, vocab_size, temperature.float(), seed.to(torch.int64),
                         position.to(torch.int64), q)
    tgt = idx + d2t[idx]
    logq = q.gather(1, tgt) - lse[:, None]  # q holds the scaled logits z until normalised below
    cfg = CONFIG
    _normalise_q_kernel[(r, triton.cdiv(lm_head.shape[0], cfg.block_vocab))](
        q, lse.contiguous(), d2t.contiguous(), lm_head.shape[0], vocab_size, BLOCK_V=cfg.block_vocab)
    return tgt, logq, q
