"""Triton kernel: attention of T new query tokens per row against a static KV cache.

This is the attention of the verify pass (T = K + 1 draft positions) and of plain decode
(T = 1). For row b, query t sits at position `pos = lens[b] - T + t` and attends causally
to the cached keys `0..pos`:

    S[t, s] = scale * <q[b, t, h], k[b, h // G, s]>            s <= pos
    O[b, t, h] = sum_s softmax_s(S[t, :])[s] * v[b, h // G, s]

with G = Hq // Hkv query heads per kv head (grouped-query attention). All T * G queries
of one kv head form one tile of BLOCK_M rows (row m = t * G + g), so each K/V block is
loaded from HBM once per group, not once per query head. The softmax is computed online
in fp32 (FlashAttention-2 style, base-2 exponentials).

Flash-decoding: each row's keys `0..lens[b]-1` are cut into NUM_SPLITS contiguous chunks
handled by separate programs, so a batch of 1 still fills the GPU. Each split writes its
unnormalized partial (acc, running max m, running sum l); a second kernel merges them:

    M = max_s m_s,   O = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s

The chunk size is derived from lens[b] inside the kernel, so no host sync is needed and
the launch depends only on static shapes (CUDA-graph friendly). T is a runtime argument;
BLOCK_M = next_pow2(T * G) clamped to 16..128 is the only compile-time dependence on T
(four values at most), so T = 1..17 needs no per-T recompile. T * G > 128 uses several
M tiles (each re-reads K/V).

Invalid input (lens[b] < T or lens[b] > S_max) is not checked here on CUDA: it would need
a host sync. The reference checks it on CPU tensors.
"""
from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

__all__ = ["verify_attention"]

_LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["T", "NUM_SPLITS"])
def _verify_attention_kernel(
    q_ptr, k_ptr, v_ptr, lens_ptr, out_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,  # [B * Hkv, NUM_SPLITS, T * G, (D)] fp32, SPLIT only
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_ot, stride_oh,
    T, Hkv, NUM_SPLITS, qk_scale,  # qk_scale = scale * log2(e)
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_IEEE: tl.constexpr,  # fp32 inputs: exact fp32 dots, not TF32
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    M = T * GROUP

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row m = t * GROUP + g
    row_valid = rows < M
    t = rows // GROUP
    h = kvh * GROUP + rows % GROUP
    offs_d = tl.arange(0, HEAD_DIM)

    lens_b = tl.load(lens_ptr + b).to(tl.int32)
    # Padding rows (t >= T) get positions >= lens_b: they see every valid key, stay finite,
    # and are never stored.
    qpos = lens_b - T + t

    b64 = b.to(tl.int64)
    q_ptrs = (q_ptr + b64 * stride_qb + t[:, None].to(tl.int64) * stride_qt
              + h[:, None] * stride_qh + offs_d[None, :])
    q = tl.load(q_ptrs, mask=row_valid[:, None], other=0.0)

    # This split's key range: chunks of whole BLOCK_Ns, so splits never share a block.
    chunk = tl.cdiv(tl.cdiv(lens_b, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * chunk
    end = tl.minimum(start + chunk, lens_b)

    k_base = k_ptr + b64 * stride_kb + kvh.to(tl.int64) * stride_kh
    v_base = v_ptr + b64 * stride_vb + kvh.to(tl.int64) * stride_vh
    offs_n = tl.arange(0, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        col_valid = cols < end
        kt = tl.load(k_base + offs_d[:, None] + cols[None, :].to(tl.int64) * stride_ks,
                     mask=col_valid[None, :], other=0.0)  # [HEAD_DIM, BLOCK_N]
        if DOT_IEEE:
            s = tl.dot(q, kt, input_precision="ieee")
        else:
            s = tl.dot(q, kt)
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

    if SPLIT:
        part_row = (pid_bh * NUM_SPLITS + split).to(tl.int64) * M + rows
        tl.store(part_m_ptr + part_row, m_i, mask=row_valid)
        tl.store(part_l_ptr + part_row, l_i, mask=row_valid)
        tl.store(part_acc_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=row_valid[:, None])
    else:
        o = acc / l_i[:, None]
        o_ptrs = (out_ptr + b64 * stride_ob + t[:, None].to(tl.int64) * stride_ot
                  + h[:, None] * stride_oh + offs_d[None, :])
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


@triton.jit(do_not_specialize=["T", "NUM_SPLITS"])
def _verify_attention_combine_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr,
    stride_ob, stride_ot, stride_oh,
    T, Hkv, NUM_SPLITS,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    b = pid_bh // Hkv
    kvh = pid_bh % Hkv
    M = T * GROUP

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < M
    t = rows // GROUP
    h = kvh * GROUP + rows % GROUP
    offs_d = tl.arange(0, HEAD_DIM)

    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for s in range(0, NUM_SPLITS):
        part_row = (pid_bh * NUM_SPLITS + s).to(tl.int64) * M + rows
        m_s = tl.load(part_m_ptr + part_row, mask=row_valid, other=float("-inf"))
        l_s = tl.load(part_l_ptr + part_row, mask=row_valid, other=0.0)
        acc_s = tl.load(part_acc_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :],
                        mask=row_valid[:, None], other=0.0)
        m_new = tl.maximum(m, m_s)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m - m_safe)
        beta = tl.math.exp2(m_s - m_safe)
        acc = acc * alpha[:, None] + acc_s * beta[:, None]
        l = l * alpha + l_s * beta
        m = m_new

    o = acc / tl.where(row_valid, l, 1.0)[:, None]  # padding rows have l == 0
    o_ptrs = (out_ptr + b.to(tl.int64) * stride_ob + t[:, None].to(tl.int64) * stride_ot
              + h[:, None] * stride_oh + offs_d[None, :])
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _default_num_splits(q: torch.Tensor, programs: int, s_max: int) -> int:
    if not q.is_cuda:
        return 1
    device_index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    target = 2 * _sm_count(device_index)  # ~2 programs per SM
    # Keep >= 256 cache slots per split at full cache so the merge stays cheap.
    return max(1, min(triton.cdiv(target, programs), s_max // 256, 32))


def attention_num_warps(block_m: int, head_dim: int) -> int:
    """Warps per program (the compile check compiles the same choice). Several bf16 tiles still
    spill registers on sm_80/sm_90 with it (`python -m specrt.kernels.compile_check`; see
    benchmarks/RESULTS.md): retuning them needs a GPU to measure."""
    return 8 if block_m * head_dim >= 128 * 128 else 4


def _check_inputs(q, k_cache, v_cache, lens) -> torch.Tensor:
    """Shapes, dtypes, devices and strides the kernel relies on; returns lens contiguous."""
    assert q.dim() == 4 and k_cache.dim() == 4, "q must be [B, T, Hq, D], caches [B, Hkv, S_max, D]"
    B, T, Hq, D = q.shape
    Bk, Hkv, S_max, Dk = k_cache.shape
    assert v_cache.shape == k_cache.shape, "k_cache and v_cache must have the same shape"
    assert (Bk, Dk) == (B, D), f"cache {tuple(k_cache.shape)} does not match q {tuple(q.shape)}"
    assert Hq % Hkv == 0, f"Hq={Hq} must be a multiple of Hkv={Hkv}"
    assert D >= 16 and D & (D - 1) == 0, f"head dim must be a power of two >= 16, got {D}"
    assert q.dtype in (torch.float16, torch.bfloat16, torch.float32), f"unsupported dtype {q.dtype}"
    assert k_cache.dtype == q.dtype and v_cache.dtype == q.dtype, "q, k_cache, v_cache dtypes differ"
    assert lens.shape == (B,) and lens.dtype in (torch.int32, torch.int64), "lens must be [B] int32/int64"
    assert q.device == k_cache.device == v_cache.device == lens.device, "inputs on different devices"
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        assert x.stride(-1) == 1, f"{name} must be contiguous in the head dim"
    lens = lens.contiguous()
    if not q.is_cuda:
        assert os.environ.get("TRITON_INTERPRET") == "1", (
            "Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before specrt.kernels is imported"
        )
        assert bool((lens >= T).all()) and bool((lens <= S_max).all()), "lens out of [T, S_max]"
    return lens


def verify_attention(
    q: torch.Tensor,  # [B, T, Hq, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lens: torch.Tensor,  # [B] int32/int64, valid positions per row including the T new ones
    scale: float | None = None,
    *,
    num_splits: int | None = None,  # flash-decoding splits; None: from SM count (1 on CPU)
    block_n: int | None = None,  # keys per inner step; None: 64 (32 for fp32)
) -> torch.Tensor:  # [B, T, Hq, D], q.dtype
    """Launch the verify-attention kernel; see the module docstring for the math."""
    lens = _check_inputs(q, k_cache, v_cache, lens)
    B, T, Hq, D = q.shape
    Hkv, S_max = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    M = T * G
    BLOCK_M = min(128, max(16, triton.next_power_of_2(M)))
    m_tiles = triton.cdiv(M, BLOCK_M)
    BLOCK_N = block_n or (32 if q.dtype == torch.float32 else 64)
    if num_splits is None:
        num_splits = _default_num_splits(q, B * Hkv * m_tiles, S_max)
    assert num_splits >= 1
    qk_scale = (1.0 / math.sqrt(D) if scale is None else scale) * _LOG2E
    num_warps = attention_num_warps(BLOCK_M, D)

    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    split = num_splits > 1
    if split:
        part_acc = torch.empty((B * Hkv, num_splits, M, D), device=q.device, dtype=torch.float32)
        part_m = torch.empty((B * Hkv, num_splits, M), device=q.device, dtype=torch.float32)
        part_l = torch.empty_like(part_m)
    else:
        part_acc = part_m = part_l = out  # unused when SPLIT is False

    _verify_attention_kernel[(B * Hkv, m_tiles, num_splits)](
        q, k_cache, v_cache, lens, out,
        part_acc, part_m, part_l,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        T, Hkv, num_splits, qk_scale,
        GROUP=G, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, SPLIT=split,
        DOT_IEEE=q.dtype == torch.float32, num_warps=num_warps, num_stages=2,
    )
    if split:
        COMBINE_M = 16
        _verify_attention_combine_kernel[(B * Hkv, triton.cdiv(M, COMBINE_M))](
            part_acc, part_m, part_l, out,
            out.stride(0), out.stride(1), out.stride(2),
            T, Hkv, num_splits,
            GROUP=G, HEAD_DIM=D, BLOCK_M=COMBINE_M, num_warps=4,
        )
    return out
