"""Triton kernel: attention of T new query tokens per row against a static KV cache.

This is the attention of the verify pass (T = K + 1 draft positions) and of plain decode
(T = 1). For row b, query t sits at position `pos = lens[b] - T + t` and attends causally
to the cached keys `0..pos`:

    S[t, s] = scale * <q[b, t, h], k[b, h // G, s]>            s <= pos
    O[b, t, h] = sum_s softmax_s(S[t, :])[s] * v[b, h // G, s]

with G = Hq // Hkv query heads per kv head (grouped-query attention). All T * G queries
of one kv head form tiles of BLOCK_M rows (row m = t * G + g), so each K/V block is loaded
once per group, not once per query head. The softmax is computed online in fp32
(FlashAttention-2 style, base-2 exponentials).

Batch invariance (a query's result has the same bits whatever T it is verified with, so a
verify pass reproduces the decode steps it replaces, in bf16 too):
- one query tile size BLOCK_M for every T (so one MMA path: no mma.sync for small T and
  wgmma for large T); T and GROUP are runtime arguments, never compile-time constants;
- flash-decoding splits at fixed key positions: split s covers keys
  `[s * split_keys, (s + 1) * split_keys)` and the number of splits is `cdiv(S_max,
  split_keys)`, fixed by the cache, not by `lens` or T. Keys past a query's position are
  masked, and a masked block or an empty split adds exact zeros;
- a split past the row's last key (`lens[b]`) would only add exact zeros, so it returns at
  once: the launch has `cdiv(S_max, split_keys)` splits, the work only the live ones;
- the live splits' partials (acc, running max m, running sum l) are merged in split order by
  the last of them to finish (an atomic ticket per tile, reset by that program), so a split
  attention is one kernel:

    M = max_s m_s,   O = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s

FUSED mode (`rope_verify_attention`) reads q, k, v of the new tokens from the QKV projection
output (no bias), adds the bias, applies RoPE to q and k (`rope.roped_rows`) and writes the new
tokens' k and v into the cache at `lens[b] - T + t`, all inside the attention kernel: each
program writes the new tokens of its own key range (split), then a CTA barrier, then reads
them back like any cached key, so no other program's write is awaited and no other kernel is
needed. (Writing before the loop, not inside it, keeps the bf16 tiles free of spills.)

The launch depends only on static shapes (CUDA-graph friendly, no host sync). Invalid input
(lens[b] < T or lens[b] > S_max) is not checked on CUDA: it would need a host sync. The
reference checks it on CPU tensors.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specrt.kernels.checks import require, require_runnable
from specrt.kernels.triton.rope import roped_rows
from specrt.kernels.triton.tickets import ticket_buffer, unused_f32

__all__ = ["verify_attention", "rope_verify_attention", "HEAD_DIMS", "DTYPES", "BLOCK_M",
           "SPLIT_KEYS", "block_n_for", "num_warps_for"]

# What the launchers can pick; `specrt.kernels.compile_check` compiles exactly these.
HEAD_DIMS = (64, 128)                  # the Qwen2.5 family's; others take SDPA (backends.cuda)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_M = 64                           # query rows (t, g) per program, for every T
SPLIT_KEYS = 128                       # keys per flash-decoding split on CUDA
_LOG2E = 1.4426950408889634


def block_n_for(dtype: torch.dtype) -> int:
    """Keys per inner step."""
    return 32 if dtype == torch.float32 else 64


def num_warps_for(head_dim: int) -> int:
    """8 warps for 64 x 128 tiles: with 4, the bf16 fused kernel spills on sm_80/sm_90
    (`python -m specrt.kernels.compile_check`)."""
    return 8 if head_dim >= 128 else 4


@triton.jit(do_not_specialize=["T", "Hkv", "GROUP", "NUM_SPLITS", "split_keys", "rope_len"])
def _verify_attention_kernel(
    q_ptr,  # FUSED: qkv [B, T, (Hq + 2 Hkv) * D] (no bias); else q [B, T, Hq, D]
    k_ptr, v_ptr,  # caches [B, Hkv, S_max, D]
    lens_ptr, out_ptr,  # lens [B]; out [B, T, Hq, D]
    bias_ptr, cos_ptr, sin_ptr,  # FUSED only: bias [(Hq + 2 Hkv) * D], tables [rope_len, D]
    part_acc_ptr, part_m_ptr, part_l_ptr,  # [B * Hkv, NUM_SPLITS, T * G, (D)] fp32
    count_ptr,  # [B * Hkv * m_tiles] int32 tickets, zero between launches
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_ot, stride_oh,
    T, Hkv, GROUP, NUM_SPLITS, split_keys, rope_len, qk_scale,  # qk_scale = scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FUSED: tl.constexpr,
    DOT_IEEE: tl.constexpr,  # fp32 inputs: exact fp32 dots, not TF32
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    M = T * GROUP
    Hq = Hkv * GROUP

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row m = t * GROUP + g
    row_valid = rows < M
    t = rows // GROUP
    h = kvh * GROUP + rows % GROUP
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)

    lens_b = tl.load(lens_ptr + b).to(tl.int32)
    new_start = lens_b - T  # the T new tokens sit at new_start..lens_b - 1
    # Padding rows (t >= T) get positions >= lens_b: they stay finite and are never stored.
    qpos = new_start + t

    # A split past the row's last key would add exact zeros: it stops here, and the tile's
    # ticket counts only the live splits, so a cache's size (S_max) costs nothing per launch.
    # Capped at the launch's splits: an (unchecked on CUDA) lens_b > S_max must not leave a
    # ticket waiting for splits that do not exist (the buffer is shared with every launch).
    live = tl.minimum(tl.cdiv(lens_b, split_keys), NUM_SPLITS)
    if split >= live:
        return

    b64 = b.to(tl.int64)
    q_base = q_ptr + b64 * stride_qb
    start = split * split_keys
    end = tl.minimum(start + split_keys, lens_b)
    k_base = k_ptr + b64 * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + b64 * stride_vb + kvh.to(tl.int64) * stride_vh
    q_rows = q_base + t.to(tl.int64) * stride_qt + h * stride_qh  # [BLOCK_M]
    if FUSED:
        # Write this split's new keys and values into the cache (every M tile of the split
        # writes the same bits), then read them back like any cached key: a CTA barrier makes
        # the program's own global writes visible to all its threads.
        k_off = (Hq + kvh) * HEAD_DIM  # this kv head's k and v inside a qkv row
        v_off = (Hq + Hkv + kvh) * HEAD_DIM
        for start_n in range(tl.maximum(start, new_start), end, BLOCK_N):
            cols = start_n + offs_n
            is_new = cols < end
            src = q_base + (cols - new_start).to(tl.int64) * stride_qt  # [BLOCK_N] new token rows
            k_tab = tl.minimum(cols, rope_len - 1).to(tl.int64) * HEAD_DIM
            k_new = roped_rows(src + k_off, bias_ptr + k_off + 0 * cols, k_tab, cos_ptr, sin_ptr,
                               is_new, HEAD_DIM)
            tl.store(k_base + cols[:, None].to(tl.int64) * stride_ks + offs_d[None, :],
                     k_new.to(k_ptr.dtype.element_ty), mask=is_new[:, None])
            v_new = (tl.load(src[:, None] + v_off + offs_d[None, :], mask=is_new[:, None],
                             other=0.0).to(tl.float32)
                     + tl.load(bias_ptr + v_off + offs_d).to(tl.float32)[None, :])
            tl.store(v_base + cols[:, None].to(tl.int64) * stride_vs + offs_d[None, :],
                     v_new.to(v_ptr.dtype.element_ty), mask=is_new[:, None])
        tl.debug_barrier()
        q_tab = tl.minimum(qpos, rope_len - 1).to(tl.int64) * HEAD_DIM
        q = roped_rows(q_rows, bias_ptr + h * HEAD_DIM, q_tab, cos_ptr, sin_ptr, row_valid,
                       HEAD_DIM).to(k_ptr.dtype.element_ty)
    else:
        q = tl.load(q_rows[:, None] + offs_d[None, :], mask=row_valid[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        col_valid = cols < end
        k = tl.load(k_base + cols[:, None].to(tl.int64) * stride_ks + offs_d[None, :],
                    mask=col_valid[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
        if DOT_IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * qk_scale
        visible = col_valid[None, :] & (cols[None, :] <= qpos[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row may see no key in this block (or split): keep its exponentials at 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None].to(tl.int64) * stride_vs + offs_d[None, :],
                    mask=col_valid[:, None], other=0.0)  # [BLOCK_N, HEAD_DIM]
        if DOT_IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    o_ptrs = (out_ptr + b64 * stride_ob + t[:, None].to(tl.int64) * stride_ot
              + h[:, None] * stride_oh + offs_d[None, :])
    if NUM_SPLITS == 1:
        tl.store(o_ptrs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
                 mask=row_valid[:, None])
    else:
        part_row = (pid_bh * NUM_SPLITS + split).to(tl.int64) * M + rows
        tl.store(part_m_ptr + part_row, m_i, mask=row_valid)
        tl.store(part_l_ptr + part_row, l_i, mask=row_valid)
        tl.store(part_acc_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None])
        tl.debug_barrier()  # every thread's partials are written before the ticket is taken
        ticket_ptr = count_ptr + pid_bh * tl.num_programs(1) + pid_m
        ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
        if ticket == live - 1:  # the last live split of this tile merges, in split order
            m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l = tl.zeros([BLOCK_M], dtype=tl.float32)
            o = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
            for s_i in range(0, live):
                pr = (pid_bh * NUM_SPLITS + s_i).to(tl.int64) * M + rows
                m_s = tl.load(part_m_ptr + pr, mask=row_valid, other=float("-inf"),
                              cache_modifier=".cg")
                l_s = tl.load(part_l_ptr + pr, mask=row_valid, other=0.0, cache_modifier=".cg")
                acc_s = tl.load(part_acc_ptr + pr[:, None] * HEAD_DIM + offs_d[None, :],
                                mask=row_valid[:, None], other=0.0, cache_modifier=".cg")
                m_new = tl.maximum(m, m_s)
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.math.exp2(m - m_safe)
                beta = tl.math.exp2(m_s - m_safe)
                o = o * alpha[:, None] + acc_s * beta[:, None]
                l = l * alpha + l_s * beta
                m = m_new
            o = o / tl.where(row_valid, l, 1.0)[:, None]  # padding rows have l == 0
            tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
            tl.atomic_xchg(ticket_ptr, 0)  # ready for the next launch (and graph replay)


def _check_common(q, k_cache, v_cache, lens, T, D):
    require(k_cache.dim() == 4 and v_cache.shape == k_cache.shape,
            "caches must be [B, Hkv, S_max, D]")
    require(D in HEAD_DIMS, f"head dim must be one of {HEAD_DIMS}, got {D}")
    require(q.dtype in DTYPES, f"unsupported dtype {q.dtype}")
    require(k_cache.dtype == q.dtype and v_cache.dtype == q.dtype,
            "q, k_cache, v_cache dtypes differ")
    B = k_cache.shape[0]
    require(lens.shape == (B,) and lens.dtype in (torch.int32, torch.int64),
            "lens must be [B] int32/int64")
    require(q.device == k_cache.device == v_cache.device == lens.device,
            "inputs on different devices")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        require(x.stride(-1) == 1, f"{name} must be contiguous in the head dim")
    lens = lens.contiguous()
    require_runnable(q)
    if not q.is_cuda:       # lens is on the host only here: checking it on CUDA would sync
        S_max = k_cache.shape[2]
        require(bool((lens >= T).all()) and bool((lens <= S_max).all()), "lens out of [T, S_max]")
    return lens


def _launch(src, k_cache, v_cache, lens, out, T, G, scale, split_keys, fused,
            bias=None, cos=None, sin=None):
    B, Hkv, S_max, D = k_cache.shape
    M = T * G
    BLOCK_N = block_n_for(src.dtype)
    if split_keys is None:  # CPU (the interpreter): one split
        split_keys = SPLIT_KEYS if src.is_cuda else triton.cdiv(S_max, BLOCK_N) * BLOCK_N
    require(split_keys % BLOCK_N == 0, f"split_keys {split_keys} must be a multiple of {BLOCK_N}")
    num_splits = triton.cdiv(S_max, split_keys)
    m_tiles = triton.cdiv(M, BLOCK_M)
    qk_scale = (1.0 / math.sqrt(D) if scale is None else scale) * _LOG2E
    if num_splits > 1:
        part_acc = torch.empty((B * Hkv, num_splits, M, D), device=src.device, dtype=torch.float32)
        part_m = torch.empty((B * Hkv, num_splits, M), device=src.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
        tickets = ticket_buffer(src.device, B * Hkv * m_tiles)
    else:
        part_acc = part_m = part_l = unused_f32(src.device)       # never read: one split
        tickets = ticket_buffer(src.device, 1)
    if not fused:
        bias = cos = sin = src  # never read
    stride_qh = D if fused else src.stride(2)
    _verify_attention_kernel[(B * Hkv, m_tiles, num_splits)](
        src, k_cache, v_cache, lens, out, bias, cos, sin,
        part_acc, part_m, part_l, tickets,
        src.stride(0), src.stride(1), stride_qh,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        T, Hkv, G, num_splits, split_keys, cos.shape[0] if fused else 1, qk_scale,
        HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, FUSED=fused,
        DOT_IEEE=src.dtype == torch.float32, num_warps=num_warps_for(D), num_stages=2,
    )
    return out


def verify_attention(
    q: torch.Tensor,  # [B, T, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lens: torch.Tensor,  # [B] int32/int64, valid positions per row including the T new ones
    scale: float | None = None,
    *,
    split_keys: int | None = None,  # keys per split; None: SPLIT_KEYS on CUDA, one split on CPU
) -> torch.Tensor:  # [B, T, Hq, D], q.dtype
    """Attention of q (already rotated) against caches that already hold the new tokens."""
    require(q.dim() == 4, "q must be [B, T, Hq, D]")
    B, T, Hq, D = q.shape
    lens = _check_common(q, k_cache, v_cache, lens, T, D)
    require(k_cache.shape[0] == B and k_cache.shape[3] == D,
            f"cache {tuple(k_cache.shape)} does not match q {tuple(q.shape)}")
    Hkv = k_cache.shape[1]
    require(Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return _launch(q, k_cache, v_cache, lens, out, T, Hq // Hkv, scale, split_keys, False)


def rope_verify_attention(
    qkv: torch.Tensor,  # [B, T, (Hq + 2 Hkv) * D], the QKV projection without its bias
    bias: torch.Tensor,  # [(Hq + 2 Hkv) * D] (zeros for models without one)
    cos: torch.Tensor,  # [rope_len, D] rotary tables (rotate-half layout)
    sin: torch.Tensor,  # [rope_len, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D], written at lens - T .. lens - 1
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lens: torch.Tensor,  # [B] valid positions per row after this pass
    num_heads: int,  # Hq
    scale: float | None = None,
    *,
    split_keys: int | None = None,
) -> torch.Tensor:  # [B, T, Hq, D], qkv.dtype
    """Bias + RoPE + KV-cache write + attention in one kernel (see the module docstring)."""
    require(qkv.dim() == 3 and qkv.stride(-1) == 1, "qkv must be [B, T, (Hq + 2 Hkv) * D]")
    B, T, width = qkv.shape
    Bk, Hkv, _, D = k_cache.shape
    require(Bk == B and width == (num_heads + 2 * Hkv) * D,
            f"qkv {tuple(qkv.shape)} does not match Hq={num_heads} and cache "
            f"{tuple(k_cache.shape)}")
    require(num_heads % Hkv == 0, f"Hq={num_heads} must be a multiple of Hkv={Hkv}")
    require(bias.shape == (width,) and bias.is_contiguous(), f"bias must be [{width}]")
    require(cos.shape == sin.shape and cos.shape[1] == D and cos.is_contiguous()
            and sin.is_contiguous(), f"cos and sin must be contiguous [positions, {D}] tables")
    require(bias.dtype == cos.dtype == sin.dtype == qkv.dtype, "qkv, bias and tables dtypes differ")
    lens = _check_common(qkv, k_cache, v_cache, lens, T, D)
    out = torch.empty((B, T, num_heads, D), device=qkv.device, dtype=qkv.dtype)
    return _launch(qkv, k_cache, v_cache, lens, out, T, num_heads // Hkv, scale, split_keys,
                   True, bias, cos, sin)
