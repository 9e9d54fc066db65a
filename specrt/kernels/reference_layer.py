"""Pure-PyTorch references for the CUDA backend's fused layer kernels.

The specification of `triton/add_rms_norm.py`, `triton/silu_mul.py`, `triton/matmul.py` and
the FUSED mode of `triton/verify_attention.py` (bias + RoPE + KV-cache write + attention), and
their CPU path through `dispatch.py`. The roundings follow the reference layer loop
(`specrt.model.backends.torch_ref`) where it rounds: the residual sum, the normalized row and its
product with the weight, SiLU and its product with `up`, each in the input dtype. The fused RoPE
computes bias + rotation in fp32 and rounds once (a kernel keeps the row in registers).
This module must not pick a backend or import Triton.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specrt.kernels import reference

__all__ = ["add_rms_norm", "silu_mul", "matmul", "qkv_rope", "rope_verify_attention"]


def add_rms_norm(
    x: torch.Tensor,  # [N, H]
    y: torch.Tensor | None,  # [N, H] added to x first, or None
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # normed [N, H], residual x + y [N, H]
    """RMSNorm(x + y) * weight and the residual sum x + y, both in x's dtype."""
    r = x if y is None else x + y
    rf = r.float()
    normed = (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps)).to(r.dtype)
    return weight * normed, r


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2 I] -> [N, I]
    """SiLU(gate) * up of the fused gate/up projection's output (gate first)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def matmul(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    out_dtype: torch.dtype | None = None,  # x.dtype (default) or torch.float32
) -> torch.Tensor:  # [M, N]
    """x @ weight^T + bias with exact products summed in fp32, the bias added in fp32 and one
    rounding to out_dtype: fp32 logits of bf16 weights are the accumulator itself, never a
    bf16 result upcast. (Which order the fp32 sums take is the kernel's business: its
    batch invariance is tested against itself, its values against this.)"""
    y = x.float() @ weight.float().t()                                 # [M, N]
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)


def qkv_rope(
    qkv: torch.Tensor,  # [B, T, (Hq + 2 Hkv) * D], projection without its bias
    bias: torch.Tensor,  # [(Hq + 2 Hkv) * D]
    cos: torch.Tensor,  # [S, D]
    sin: torch.Tensor,  # [S, D]
    pos: torch.Tensor,  # [B, T] positions
    num_heads: int,
    num_kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # q [B,T,Hq,D], k, v [B,T,Hkv,D]
    """Add the bias, rotate q and k (rotate-half RoPE at `pos`) in fp32, round once."""
    B, T, W = qkv.shape
    D = W // (num_heads + 2 * num_kv_heads)
    x = qkv.float() + bias.float()
    q, k, v = x.split([num_heads * D, num_kv_heads * D, num_kv_heads * D], dim=-1)
    p = pos.clamp(max=cos.shape[0] - 1)
    c = cos.float()[p][:, :, None]                                     # [B, T, 1, D]
    s = sin.float()[p][:, :, None]

    def rope(t: torch.Tensor) -> torch.Tensor:
        half = D // 2
        return t * c + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * s

    q = rope(q.reshape(B, T, num_heads, D))
    k = rope(k.reshape(B, T, num_kv_heads, D))
    v = v.reshape(B, T, num_kv_heads, D)
    return q.to(qkv.dtype), k.to(qkv.dtype), v.to(qkv.dtype)


def rope_verify_attention(
    qkv: torch.Tensor,  # [B, T, (Hq + 2 Hkv) * D]
    bias: torch.Tensor,  # [(Hq + 2 Hkv) * D]
    cos: torch.Tensor,  # [S, D]
    sin: torch.Tensor,  # [S, D]
    k_cache: torch.Tensor,  # [B, Hkv, S_max, D], written at lens - T .. lens - 1
    v_cache: torch.Tensor,  # [B, Hkv, S_max, D]
    lens: torch.Tensor,  # [B] valid positions per row after this pass
    num_heads: int,
    scale: float | None = None,
) -> torch.Tensor:  # [B, T, Hq, D]
    """`qkv_rope`, the new tokens' k/v written into the caches, then `verify_attention`."""
    B, T, _ = qkv.shape
    Hkv = k_cache.shape[1]
    pos = lens.long().view(B, 1) - T + torch.arange(T, device=qkv.device)   # [B, T]
    q, k, v = qkv_rope(qkv, bias, cos, sin, pos, num_heads, Hkv)
    rows = torch.arange(B, device=qkv.device)[:, None].expand(B, T)
    k_cache[rows, :, pos] = k
    v_cache[rows, :, pos] = v
    return reference.verify_attention(q, k_cache, v_cache, lens, scale)
