"""Triton kernels: accept/reject K draft tokens against the target model's distribution.

Draft / accepted / rejected / recovered / bonus tokens mean what `specrt/engine/round.py`
defines; `-1` marks a missing draft. Every row emits num_accepted + 1 tokens:
`out_tokens[b, :n + 1]` = accepted drafts + recovered/bonus, the rest -1.

greedy_accept:      t_j = argmax_v logits[b, j, v] (ties -> lowest v), j = 0..K
                    n   = min{ j < K : draft[b, j] != t_j }  (K if none);  emit t_n.
rejection_sample:   accept draft x_i iff u_i * q_i(x_i) < p_i(x_i)  (q = 1 for one-hot
                    drafts; padding is rejected); n = first rejection (K if none);
                    emit argmax_v r_n[v] / e[v], with r_n = max(0, p_n - q_n) (one-hot: p_n
                    with x_n zeroed; padding or n = K: p_n) and e ~ Exp(1). If r_n / e is
                    all zero, emit argmax_v p_n[v] / e[v] instead. Ties -> lowest v.
                    The division is IEEE round-to-nearest (`div_rn`) so results match the
                    PyTorch reference bit for bit on the same uniforms and noise.

Both ops read the vocabulary axis once with a split-V grid: (rows, V / SPLIT_SIZE)
programs each reduce one chunk to a partial (max, lowest argmax), and a one-program-per-row
finalize kernel merges the partials, walks the drafts and writes the outputs. The per-lane
running (max, index) accumulators make ties resolve to the lowest index without relying on
tl.argmax's tie rule. No host sync anywhere; shapes alone determine the launch.
NaN logits/probabilities are not supported (torch.argmax would pick the NaN).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specrt.kernels.checks import require, require_runnable

__all__ = ["greedy_accept", "rejection_sample"]


# What the launchers can pick; `specrt.kernels.compile_check` compiles exactly these.
DTYPES = ("fp16", "bf16", "fp32")     # logits / probabilities
MAX_K = 16                            # = specrt.spec.config.MAX_SPECULATIVE_TOKENS
MAX_V_SPLITS = 32                     # vocab splits a finalizer merges (BLOCK_S): V <= 32 * 8192
SPLIT_SIZE, BLOCK_V = 8192, 1024      # default vocab tiling


def block_k_for(n: int) -> int:
    """The finalizers' and the rejection partial's position block for n positions."""
    return max(2, triton.next_power_of_2(n))


@triton.jit
def _row_argmax_partial_kernel(
    x_ptr,  # [B, K + 1, V] logits
    stride_xb, stride_xk,
    part_val_ptr, part_idx_ptr,  # [B * (K + 1), NUM_SPLITS] fp32 / int32
    K1, V, NUM_SPLITS,
    SPLIT_SIZE: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    split = tl.program_id(1)
    b = row // K1
    j = row % K1
    base = x_ptr + b.to(tl.int64) * stride_xb + j.to(tl.int64) * stride_xk

    lanes = tl.arange(0, BLOCK_V)
    start = split * SPLIT_SIZE
    best = tl.full([BLOCK_V], float("-inf"), dtype=tl.float32)
    best_idx = start + lanes
    for off in range(0, SPLIT_SIZE, BLOCK_V):
        cols = start + off + lanes
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        upd = x > best  # strict: an earlier column keeps a tie
        best = tl.where(upd, x, best)
        best_idx = tl.where(upd, cols, best_idx)
    top = tl.max(best, axis=0)
    top_idx = tl.min(tl.where(best == top, best_idx, V), axis=0)
    tl.store(part_val_ptr + row * NUM_SPLITS + split, top)
    tl.store(part_idx_ptr + row * NUM_SPLITS + split, top_idx)


@triton.jit
def _greedy_finalize_kernel(
    part_val_ptr, part_idx_ptr,  # [B * (K + 1), NUM_SPLITS]
    draft_ptr, stride_db,  # [B, K]
    num_accepted_ptr,  # [B] int32
    out_ptr, stride_ob,  # [B, K + 1] int64
    K, V, NUM_SPLITS,
    BLOCK_K: tl.constexpr,  # >= K + 1
    BLOCK_S: tl.constexpr,  # >= NUM_SPLITS
):
    b = tl.program_id(0)
    j = tl.arange(0, BLOCK_K)
    s = tl.arange(0, BLOCK_S)
    j_valid = j < K + 1
    mask = j_valid[:, None] & (s[None, :] < NUM_SPLITS)
    offs = (b * (K + 1) + j)[:, None] * NUM_SPLITS + s[None, :]
    val = tl.load(part_val_ptr + offs, mask=mask, other=float("-inf"))
    idx = tl.load(part_idx_ptr + offs, mask=mask, other=V)
    top = tl.max(val, axis=1)
    target = tl.min(tl.where(val == top[:, None], idx, V), axis=1).to(tl.int64)  # [BLOCK_K]

    draft = tl.load(draft_ptr + b.to(tl.int64) * stride_db + j, mask=j < K, other=-1).to(tl.int64)
    mismatch = (j < K) & (draft != target)
    n = tl.min(tl.where(mismatch, j, K), axis=0)
    out = tl.where(j < n, draft, tl.where(j == n, target, -1))
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + j, out, mask=j_valid)
    tl.store(num_accepted_ptr + b, n)


@triton.jit
def _rejection_partial_kernel(
    tp_ptr, stride_tb, stride_tk,  # [B, K + 1, V] target probs
    dp_ptr, stride_db, stride_dk,  # [B, K, V] draft probs (unused unless HAS_DRAFT_PROBS)
    draft_ptr, stride_xb,  # [B, K]
    u_ptr, stride_ub,  # [B, K]
    noise_ptr, stride_nb,  # [B, V]
    num_accepted_ptr,  # [B] int32, written by split 0
    part_r_val_ptr, part_r_idx_ptr,  # [B, NUM_SPLITS]: best residual score
    part_p_val_ptr, part_p_idx_ptr,  # [B, NUM_SPLITS]: best fallback score p / noise
    K, V, NUM_SPLITS,
    HAS_DRAFT_PROBS: tl.constexpr,
    SPLIT_SIZE: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,  # >= K (power of two)
):
    b = tl.program_id(0)
    split = tl.program_id(1)
    b64 = b.to(tl.int64)

    # The accept walk is K scalars: every split recomputes it rather than syncing.
    j = tl.arange(0, BLOCK_K)
    j_valid = j < K
    x = tl.load(draft_ptr + b64 * stride_xb + j, mask=j_valid, other=-1).to(tl.int64)
    x_valid = j_valid & (x >= 0) & (x < V)      # an id past V is no draft: no read past the row
    p_x = tl.load(tp_ptr + b64 * stride_tb + j.to(tl.int64) * stride_tk + x,
                  mask=x_valid, other=0.0).to(tl.float32)
    if HAS_DRAFT_PROBS:
        q_x = tl.load(dp_ptr + b64 * stride_db + j.to(tl.int64) * stride_dk + x,
                      mask=x_valid, other=1.0).to(tl.float32)
    else:
        q_x = tl.full([BLOCK_K], 1.0, dtype=tl.float32)
    u = tl.load(u_ptr + b64 * stride_ub + j, mask=j_valid, other=1.0).to(tl.float32)
    accept = x_valid & (u * q_x < p_x)
    n = tl.min(tl.where(j_valid & (accept == 0), j, K), axis=0)
    x_n = tl.max(tl.where(j == n, x, -1), axis=0)  # -1 for padding and for n == K (bonus)
    has_q = x_n >= 0

    p_row = tp_ptr + b64 * stride_tb + n.to(tl.int64) * stride_tk
    q_row = dp_ptr + b64 * stride_db + n.to(tl.int64) * stride_dk
    e_row = noise_ptr + b64 * stride_nb
    lanes = tl.arange(0, BLOCK_V)
    start = split * SPLIT_SIZE
    best_r = tl.full([BLOCK_V], -1.0, dtype=tl.float32)
    idx_r = start + lanes
    best_p = tl.full([BLOCK_V], -1.0, dtype=tl.float32)
    idx_p = start + lanes
    for off in range(0, SPLIT_SIZE, BLOCK_V):
        cols = start + off + lanes
        col_valid = cols < V
        p = tl.load(p_row + cols, mask=col_valid, other=0.0).to(tl.float32)
        e = tl.load(e_row + cols, mask=col_valid, other=1.0).to(tl.float32)
        if HAS_DRAFT_PROBS:
            q = tl.load(q_row + cols, mask=col_valid & has_q, other=0.0).to(tl.float32)
            r = tl.maximum(p - q, 0.0)
        else:
            r = tl.where(cols == x_n, 0.0, p)
        score_r = tl.where(col_valid, tl.math.div_rn(r, e), -1.0)
        score_p = tl.where(col_valid, tl.math.div_rn(p, e), -1.0)
        upd = score_r > best_r  # strict: an earlier column keeps a tie
        best_r = tl.where(upd, score_r, best_r)
        idx_r = tl.where(upd, cols, idx_r)
        upd = score_p > best_p
        best_p = tl.where(upd, score_p, best_p)
        idx_p = tl.where(upd, cols, idx_p)

    out_off = b * NUM_SPLITS + split
    top_r = tl.max(best_r, axis=0)
    tl.store(part_r_val_ptr + out_off, top_r)
    tl.store(part_r_idx_ptr + out_off, tl.min(tl.where(best_r == top_r, idx_r, V), axis=0))
    top_p = tl.max(best_p, axis=0)
    tl.store(part_p_val_ptr + out_off, top_p)
    tl.store(part_p_idx_ptr + out_off, tl.min(tl.where(best_p == top_p, idx_p, V), axis=0))
    tl.store(num_accepted_ptr + b, n, mask=split == 0)


@triton.jit
def _rejection_finalize_kernel(
    part_r_val_ptr, part_r_idx_ptr, part_p_val_ptr, part_p_idx_ptr,  # [B, NUM_SPLITS]
    draft_ptr, stride_xb,  # [B, K]
    num_accepted_ptr,  # [B] int32
    out_ptr, stride_ob,  # [B, K + 1] int64
    K, V, NUM_SPLITS,
    BLOCK_K: tl.constexpr,  # >= K + 1
    BLOCK_S: tl.constexpr,  # >= NUM_SPLITS
):
    b = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    s_valid = s < NUM_SPLITS
    offs = b * NUM_SPLITS + s
    val_r = tl.load(part_r_val_ptr + offs, mask=s_valid, other=-2.0)
    idx_r = tl.load(part_r_idx_ptr + offs, mask=s_valid, other=V)
    top_r = tl.max(val_r, axis=0)
    tok_r = tl.min(tl.where(val_r == top_r, idx_r, V), axis=0)
    val_p = tl.load(part_p_val_ptr + offs, mask=s_valid, other=-2.0)
    idx_p = tl.load(part_p_idx_ptr + offs, mask=s_valid, other=V)
    top_p = tl.max(val_p, axis=0)
    tok_p = tl.min(tl.where(val_p == top_p, idx_p, V), axis=0)
    # An all-zero residual (p == q) cannot be rejected in exact arithmetic; fall back to p.
    last = tl.where(top_r > 0.0, tok_r, tok_p).to(tl.int64)

    n = tl.load(num_accepted_ptr + b)
    j = tl.arange(0, BLOCK_K)
    draft = tl.load(draft_ptr + b.to(tl.int64) * stride_xb + j, mask=j < K, other=-1).to(tl.int64)
    out = tl.where(j < n, draft, tl.where(j == n, last, -1))
    tl.store(out_ptr + b.to(tl.int64) * stride_ob + j, out, mask=j < K + 1)


def _check_common(name: str, probs: torch.Tensor,
                  draft_tokens: torch.Tensor) -> tuple[int, int, int]:
    require(probs.dim() == 3, f"{name} must be [B, K + 1, V], got {tuple(probs.shape)}")
    B, K1, V = probs.shape
    require(K1 >= 1, f"{name} needs at least one position")
    require(probs.dtype in (torch.float16, torch.bfloat16, torch.float32),
            f"unsupported {name} dtype {probs.dtype}")
    require(probs.stride(-1) == 1, f"{name} must be contiguous in the vocab dim")
    require(draft_tokens.shape == (B, K1 - 1), f"draft_tokens must be [B, K]={[B, K1 - 1]}")
    require(draft_tokens.dtype in (torch.int32, torch.int64), "draft_tokens must be int32/int64")
    require(draft_tokens.device == probs.device, "inputs on different devices")
    require_runnable(probs)
    require(K1 - 1 <= MAX_K, f"at most {MAX_K} draft positions, got {K1 - 1}")
    return B, K1 - 1, V


def greedy_accept(
    target_logits: torch.Tensor,  # [B, K + 1, V]
    draft_tokens: torch.Tensor,  # [B, K] int, -1 = no draft
    *,
    split_size: int = SPLIT_SIZE,  # vocab entries per program; a multiple of block_v
    block_v: int = BLOCK_V,
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] int32, out_tokens [B, K + 1] int64
    """Launch the greedy-acceptance kernels; see the module docstring for the math."""
    B, K, V = _check_common("target_logits", target_logits, draft_tokens)
    require(split_size % block_v == 0, "split_size must be a multiple of block_v")
    draft_tokens = draft_tokens.contiguous()
    dev = target_logits.device
    num_splits = triton.cdiv(V, split_size)
    require(num_splits <= MAX_V_SPLITS,
            f"V={V} needs {num_splits} > {MAX_V_SPLITS} splits of {split_size}")
    part_val = torch.empty((B * (K + 1), num_splits), device=dev, dtype=torch.float32)
    part_idx = torch.empty((B * (K + 1), num_splits), device=dev, dtype=torch.int32)
    num_accepted = torch.empty((B,), device=dev, dtype=torch.int32)
    out_tokens = torch.empty((B, K + 1), device=dev, dtype=torch.int64)

    _row_argmax_partial_kernel[(B * (K + 1), num_splits)](
        target_logits, target_logits.stride(0), target_logits.stride(1),
        part_val, part_idx, K + 1, V, num_splits,
        SPLIT_SIZE=split_size, BLOCK_V=block_v, num_warps=4,
    )
    _greedy_finalize_kernel[(B,)](
        part_val, part_idx, draft_tokens, draft_tokens.stride(0),
        num_accepted, out_tokens, out_tokens.stride(0), K, V, num_splits,
        BLOCK_K=block_k_for(K + 1),
        BLOCK_S=MAX_V_SPLITS, num_warps=1,
    )
    return num_accepted, out_tokens


def rejection_sample(
    target_probs: torch.Tensor,  # [B, K + 1, V]
    draft_probs: torch.Tensor | None,  # [B, K, V], or None for one-hot drafts
    draft_tokens: torch.Tensor,  # [B, K] int, -1 = no draft
    uniforms: torch.Tensor,  # [B, K] fp32 in [0, 1)
    noise: torch.Tensor,  # [B, V] fp32, Exp(1), > 0
    *,
    split_size: int = SPLIT_SIZE,  # vocab entries per program; a multiple of block_v
    block_v: int = BLOCK_V,
) -> tuple[torch.Tensor, torch.Tensor]:  # num_accepted [B] int32, out_tokens [B, K + 1] int64
    """Launch the rejection-sampling kernels; see the module docstring for the math."""
    B, K, V = _check_common("target_probs", target_probs, draft_tokens)
    require(split_size % block_v == 0, "split_size must be a multiple of block_v")
    require(uniforms.shape == (B, K) and uniforms.dtype == torch.float32,
            "uniforms must be [B, K] fp32")
    require(noise.shape == (B, V) and noise.dtype == torch.float32, "noise must be [B, V] fp32")
    require(noise.stride(-1) == 1, "noise must be contiguous in the vocab dim")
    has_q = draft_probs is not None
    if has_q:
        require(draft_probs.shape == (B, K, V), f"draft_probs must be [B, K, V]={[B, K, V]}")
        require(draft_probs.stride(-1) == 1, "draft_probs must be contiguous in the vocab dim")
        dp = draft_probs
    else:
        dp = target_probs  # never read: HAS_DRAFT_PROBS is False
    draft_tokens = draft_tokens.contiguous()
    uniforms = uniforms.contiguous()
    dev = target_probs.device
    num_splits = triton.cdiv(V, split_size)
    require(num_splits <= MAX_V_SPLITS,
            f"V={V} needs {num_splits} > {MAX_V_SPLITS} splits of {split_size}")
    part_val = torch.empty((2, B, num_splits), device=dev, dtype=torch.float32)
    part_idx = torch.empty((2, B, num_splits), device=dev, dtype=torch.int32)
    num_accepted = torch.empty((B,), device=dev, dtype=torch.int32)
    out_tokens = torch.empty((B, K + 1), device=dev, dtype=torch.int64)

    _rejection_partial_kernel[(B, num_splits)](
        target_probs, target_probs.stride(0), target_probs.stride(1),
        dp, dp.stride(0), dp.stride(1),
        draft_tokens, draft_tokens.stride(0),
        uniforms, uniforms.stride(0),
        noise, noise.stride(0),
        num_accepted,
        part_val[0], part_idx[0], part_val[1], part_idx[1],
        K, V, num_splits,
        HAS_DRAFT_PROBS=has_q, SPLIT_SIZE=split_size, BLOCK_V=block_v,
        BLOCK_K=block_k_for(K), num_warps=4,
    )
    _rejection_finalize_kernel[(B,)](
        part_val[0], part_idx[0], part_val[1], part_idx[1],
        draft_tokens, draft_tokens.stride(0),
        num_accepted, out_tokens, out_tokens.stride(0), K, V, num_splits,
        BLOCK_K=block_k_for(K + 1),
        BLOCK_S=MAX_V_SPLITS, num_warps=1,
    )
    return num_accepted, out_tokens
