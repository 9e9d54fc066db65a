"""The per-layer glue of a CPU decode or verify step, through specrt._cpu_ops when it can.

A decode step of a small model on the CPU is ~85% weight streaming (specrt.kernels.cpu.gemv) and
~15% small ops: two RMSNorms, rotary embeddings, the KV-cache write, attention, SiLU and residual
adds per layer, each a handful of PyTorch dispatches. csrc/cpu/ops.cpp does each group in one
call, and computes every row on its own, so a verify pass of K + 1 rows gives the same bits as
K + 1 decode steps (in bf16 too: PyTorch's attention does not).

The PyTorch functions in specrt/model.py (`rms_norm`, `apply_rope`, `Transformer._attention`)
are the specification and the fallback; the model takes this path only for CPU bf16/fp32
decode and verify passes (`usable`) and SDPA for prefills.
"""
from __future__ import annotations

import os

import torch

try:
    from specrt import _cpu_ops

    AVAILABLE = bool(_cpu_ops.cpu_supported()) and os.environ.get("SPECRT_CPU_OPS", "1") != "0"
except ImportError:     # extension not built: the model keeps its PyTorch path
    _cpu_ops = None
    AVAILABLE = False

# Up to how many new tokens per call the C++ path serves: decode and verify passes (K + 1 <= 17
# in practice). Prefills use SDPA, whose attention is a real matrix product.
MAX_ROWS = 32


def build_id() -> str:
    """Which build serves the fused path: the extension's source hash, "library" for PyTorch."""
    return _cpu_ops.build_id() if AVAILABLE else "library"


def usable(dtype: torch.dtype, device: torch.device, rows: int) -> bool:
    return (AVAILABLE and device.type == "cpu" and dtype in (torch.bfloat16, torch.float32)
            and 0 < rows <= MAX_ROWS)


def _bf16(x: torch.Tensor) -> bool:
    return x.dtype == torch.bfloat16


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [M, H] -> RMSNorm(x) * weight [H], as model.rms_norm."""
    m, h = x.shape
    out = torch.empty_like(x)
    _cpu_ops.rms_norm(_bf16(x), x.data_ptr(), weight.data_ptr(), eps, out.data_ptr(), m, h)
    return out


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """The residual add and the next norm: x [M, H] += y (in place); returns RMSNorm(x) * w."""
    m, h = x.shape
    out = torch.empty_like(x)
    _cpu_ops.add_rms_norm(_bf16(x), x.data_ptr(), y.data_ptr(), weight.data_ptr(), eps,
                          out.data_ptr(), m, h)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] (gate, then up) -> silu(gate) * up [M, I]."""
    m, two_i = gate_up.shape
    out = torch.empty(m, two_i // 2, dtype=gate_up.dtype)
    _cpu_ops.silu_mul(_bf16(gate_up), gate_up.data_ptr(), out.data_ptr(), m, two_i // 2)
    return out


def rope_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   cos: torch.Tensor, sin: torch.Tensor, starts: torch.Tensor,
                   valid: torch.Tensor, tokens: int, num_heads: int, scale: float) -> torch.Tensor:
    """The attention block of one layer for B rows of `tokens` new tokens.

    qkv: [B * tokens, (Hq + 2 * Hkv) * D] the fused projection of the new tokens.
    k_cache, v_cache: [Bmax, Hkv, S, D] this layer's cache; row b's new k, v go to positions
        starts[b] + t for t < valid[b] (the rest are padding and are not kept).
    cos, sin: [S_rope, D] rotary tables in the model's dtype.
    starts, valid: [B] int64.
    Returns [B * tokens, Hq * D]: each query's attention over its row's keys 0..its position.
    """
    m = qkv.shape[0]
    b = starts.shape[0]
    _, hkv, s, d = k_cache.shape
    out = torch.empty(m, num_heads * d, dtype=qkv.dtype)
    _cpu_ops.rope_attention(_bf16(qkv), qkv.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
                            cos.data_ptr(), sin.data_ptr(), starts.data_ptr(), valid.data_ptr(),
                            out.data_ptr(), b, tokens, num_heads, hkv, d, s, cos.shape[0], scale,
                            torch.get_num_threads())
    return out
