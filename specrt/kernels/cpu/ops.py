"""The per-layer glue of a CPU decode or verify step, through specrt._cpu_ops when it can.

A decode step of a small model on the CPU is ~85% weight streaming (specrt.kernels.cpu.gemv) and
~15% small ops: two RMSNorms, rotary embeddings, the KV-cache write, attention, SiLU and residual
adds per layer, each a handful of PyTorch dispatches. csrc/cpu/ops.cpp does each group in one
call, and computes every row on its own, so a verify pass of K + 1 rows gives the same bits as
K + 1 decode steps (in bf16 too: PyTorch's attention does not).

The PyTorch functions in specrt/model/backends/torch_ref.py (`rms_norm`, `apply_rope`,
`sdpa_attention`) are the specification and the fallback; the model takes this path only for
CPU bf16/fp32 decode and verify passes of at most MAX_ROWS tokens a row
(`specrt.model.backends.cpu_native`) and SDPA for prefills. Every function checks its tensors
(dtype, shape, strides, device, cache bounds) and raises ValueError before a pointer reaches
C++, which trusts what it is given.

`argmax` picks a token from logits: torch.argmax (the specification) in one vector pass, used by
`specrt.kernels.argmax` for every CPU greedy choice.
"""
from __future__ import annotations


import torch

from specrt.kernels.cpu import checks, extension

# Not built, or this CPU has neither AVX-512 BF16 nor AVX2: the model keeps its PyTorch path.
_cpu_ops, AVAILABLE = extension.load("specrt._cpu_ops", "SPECRT_CPU_OPS",
                                     "the fused C++ layer ops", "the PyTorch layer ops")

# Up to how many new tokens per call the C++ path serves: decode and verify passes (K + 1 <= 17
# in practice). Prefills use SDPA, whose attention is a real matrix product.
MAX_ROWS = 32


def build_id() -> str:
    """Which build serves the fused path: the extension's source hash, "library" for PyTorch."""
    return _cpu_ops.build_id() if AVAILABLE else "library"


def _bf16(x: torch.Tensor) -> bool:
    return x.dtype == torch.bfloat16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [M, H] -> RMSNorm(x) * weight [H], as `backends.torch_ref.rms_norm`."""
    checks.require(AVAILABLE, "rms_norm", "specrt._cpu_ops (AVX-512 or AVX2)")
    checks.floating("rms_norm", "x", x, "[M, H]")
    m, h = x.shape
    checks.tensor("rms_norm", "weight", weight, x.dtype, (h,), "[H]", "x")
    out = torch.empty_like(x)
    _cpu_ops.rms_norm(_bf16(x), x.data_ptr(), weight.data_ptr(), eps, out.data_ptr(), m, h)
    return out


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """The residual add and the next norm: x [M, H] += y (in place); returns RMSNorm(x) * w."""
    checks.require(AVAILABLE, "add_rms_norm", "specrt._cpu_ops (AVX-512 or AVX2)")
    checks.floating("add_rms_norm", "x", x, "[M, H]")
    m, h = x.shape
    checks.tensor("add_rms_norm", "y", y, x.dtype, x.shape, "[M, H] like x", "x")
    checks.tensor("add_rms_norm", "weight", weight, x.dtype, (h,), "[H]", "x")
    out = torch.empty_like(x)
    _cpu_ops.add_rms_norm(_bf16(x), x.data_ptr(), y.data_ptr(), weight.data_ptr(), eps,
                          out.data_ptr(), m, h)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] (gate, then up) -> silu(gate) * up [M, I]."""
    checks.require(AVAILABLE, "silu_mul", "specrt._cpu_ops (AVX-512 or AVX2)")
    checks.floating("silu_mul", "gate_up", gate_up, "[M, 2I]")
    m, two_i = gate_up.shape
    if two_i % 2:
        raise checks.fail("silu_mul", "gate_up", "[M, 2I] (an even width: gate, then up)",
                          f"shape {tuple(gate_up.shape)}")
    out = torch.empty(m, two_i // 2, dtype=gate_up.dtype)
    _cpu_ops.silu_mul(_bf16(gate_up), gate_up.data_ptr(), out.data_ptr(), m, two_i // 2)
    return out


def rope_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, starts: torch.Tensor,
                   counts: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
    """The attention block of one layer for B rows of new tokens, packed (no padding).

    qkv: [M, (Hq + 2 * Hkv) * D] the fused projection of the new tokens, row after row: row b's
        counts[b] tokens follow row b - 1's (M = sum(counts)).
    k_cache, v_cache: [Bmax, Hkv, S, D] this layer's cache; row b's token t goes to position
        starts[b] + t.
    cos, sin: [S_rope, D] rotary tables in the model's dtype.
    starts, counts: [B] int64, with starts[b] + counts[b] <= S (counts[b] may be 0).
    Returns [M, Hq * D]: each query's attention over its row's keys 0..its position.
    """
    b, hkv, s, d = _check_attention(qkv, k_cache, v_cache, cos, sin, starts, counts, num_heads)
    offsets = checks.offsets(counts)                                          # [B + 1]
    out = torch.empty(qkv.shape[0], num_heads * d, dtype=qkv.dtype)
    _cpu_ops.rope_attention(_bf16(qkv), qkv.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                            cos.data_ptr(), sin.data_ptr(), starts.data_ptr(), offsets.data_ptr(),
                            out.data_ptr(), b, num_heads, hkv, d, s, cos.shape[0], scale,
                            torch.get_num_threads())
    return out


def argmax(x: torch.Tensor) -> torch.Tensor:
    """x [..., V] fp32 on the CPU, V >= 1 -> [...] int64: the index of each row's largest value,
    exactly as torch.argmax(x, dim=-1) gives it (the first on ties, a NaN above every number).
    Why: torch's CPU argmax compares one element at a time, 0.23 ms over one row of the
    151,936-id vocabulary and 2.3 ms over the 17 rows of a K = 16 verify pass on a 2-core
    Xeon; csrc/cpu/ops_impl.h reads each row twice with vector loads (benchmarks/RESULTS.md,
    "The argmax over the vocabulary")."""
    fn = "argmax"
    checks.require(AVAILABLE, fn, "specrt._cpu_ops (AVX-512 or AVX2)")
    if not (isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.is_cpu
            and x.dim() >= 1 and x.shape[-1] >= 1):
        raise checks.fail(fn, "x", "a CPU fp32 tensor [..., V] with V >= 1",
                          f"{getattr(x, 'dtype', type(x).__name__)} "
                          f"{tuple(getattr(x, 'shape', ()))} on {getattr(x, 'device', '?')}")
    rows = x.reshape(-1, x.shape[-1])                                         # [R, V]
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(rows.shape[0], dtype=torch.int64)                       # [R]
    if rows.shape[0]:
        _cpu_ops.argmax_rows(rows.data_ptr(), rows.shape[0], rows.shape[1], rows.stride(0),
                             out.data_ptr(), torch.get_num_threads())
    return out.view(x.shape[:-1])


def _check_attention(qkv, k_cache, v_cache, cos, sin, starts, counts,
                     num_heads: int) -> tuple[int, int, int, int]:
    """rope_attention's arguments, checked; returns (B, Hkv, S, D)."""
    fn = "rope_attention"
    checks.require(AVAILABLE, fn, "specrt._cpu_ops (AVX-512 or AVX2)")
    checks.floating(fn, "k_cache", k_cache, "[Bmax, Hkv, S, D]")
    bmax, hkv, s, d = k_cache.shape
    dt = k_cache.dtype
    checks.tensor(fn, "v_cache", v_cache, dt, k_cache.shape, "[Bmax, Hkv, S, D] like k_cache",
                  "k_cache")
    if not (isinstance(starts, torch.Tensor) and starts.dim() == 1):
        raise checks.fail(fn, "starts", "a 1-D tensor [B]",
                          getattr(starts, "shape", type(starts).__name__))
    b = starts.shape[0]
    checks.tensor(fn, "starts", starts, torch.int64, (b,), "[B]")
    checks.tensor(fn, "counts", counts, torch.int64, (b,), "[B] like starts")
    if bmax < b or hkv < 1 or s < 1 or d < 2 or d % 2:
        raise checks.fail(fn, "k_cache", f"[Bmax >= B = {b}, Hkv >= 1, S >= 1, D even >= 2]",
                          f"shape {tuple(k_cache.shape)}")
    if not (isinstance(num_heads, int) and num_heads >= 1 and num_heads % hkv == 0):
        raise checks.fail(fn, "num_heads", f"a positive multiple of Hkv = {hkv}", repr(num_heads))
    checks.row_positions(fn, starts.tolist(), counts.tolist(), s)
    m = int(counts.sum())
    checks.tensor(fn, "qkv", qkv, dt, (m, (num_heads + 2 * hkv) * d),
                  "[M = sum(counts), (Hq + 2 * Hkv) * D]", "k_cache")
    s_rope = cos.shape[0] if isinstance(cos, torch.Tensor) and cos.dim() == 2 else 0
    checks.tensor(fn, "cos", cos, dt, (max(s_rope, 1), d), "[S_rope >= 1, D]", "k_cache")
    checks.tensor(fn, "sin", sin, dt, cos.shape, "[S_rope, D] like cos", "k_cache")
    return b, hkv, s, d
