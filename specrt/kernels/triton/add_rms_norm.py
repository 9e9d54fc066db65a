"""Triton kernel: residual add + RMSNorm, one kernel, both outputs.

    r = x + y                         (in x's dtype: the new residual stream)
    out = weight * (r * rsqrt(mean(r^2) + eps))     normalized in fp32, rounded as the reference

One program per row. The sum of squares is accumulated over the row in fixed BLOCK_H chunks
and reduced once at the end, so a row's reduction order depends only on H, never on how many
rows share the launch (batch invariance: a verify pass of K + 1 rows gives each row the bits
of a decode step). Without y (`HAS_RESIDUAL=False`) it is a plain RMSNorm. Reference:
`specrt.kernels.reference_layer.add_rms_norm`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specrt.kernels.checks import require, require_runnable

__all__ = ["add_rms_norm", "DTYPES", "BLOCK_H", "NUM_WARPS"]

# What the launcher can pick; `specrt.kernels.compile_check` compiles exactly these.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK_H = 1024
NUM_WARPS = 4


@triton.jit(do_not_specialize=["H"])
def _add_rms_norm_kernel(
    x_ptr, y_ptr, w_ptr, res_ptr, out_ptr,  # x, y, res, out [N, H]; w [H]
    stride_x, stride_y, stride_r, stride_o,
    H, eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_H)
    sq = tl.zeros([BLOCK_H], dtype=tl.float32)
    for start in range(0, H, BLOCK_H):
        cols = start + offs
        mask = cols < H
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            y = tl.load(y_ptr + row * stride_y + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + y.to(tl.float32)).to(x.dtype)
            tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
        xf = x.to(tl.float32)
        sq += xf * xf
    inv = tl.math.rsqrt(tl.sum(sq, axis=0) / H + eps)
    for start in range(0, H, BLOCK_H):
        cols = start + offs
        mask = cols < H
        if HAS_RESIDUAL:  # this program's own stores above, same thread layout
            x = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        else:
            x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        normed = (x.to(tl.float32) * inv).to(x.dtype)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        out = normed.to(tl.float32) * w.to(tl.float32)
        tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor,  # [N, H]
    y: torch.Tensor | None,  # [N, H] or None
    weight: torch.Tensor,  # [H]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # normed [N, H], residual x + y [N, H] (x if no y)
    """Launch the kernel; see the module docstring for the math."""
    require(x.dim() == 2 and x.stride(-1) == 1, "x must be [N, H], contiguous in H")
    N, H = x.shape
    require(x.dtype in DTYPES and weight.dtype == x.dtype,
            f"unsupported dtypes {x.dtype}, {weight.dtype}")
    require(weight.shape == (H,) and weight.is_contiguous(), f"weight must be [{H}]")
    require(x.device == weight.device, "inputs on different devices")
    if y is not None:
        require(y.shape == x.shape and y.dtype == x.dtype and y.stride(-1) == 1, "y must match x")
    require_runnable(x)
    out = torch.empty((N, H), device=x.device, dtype=x.dtype)
    res = x if y is None else torch.empty_like(out)
    y_arg = x if y is None else y  # never read without a residual
    _add_rms_norm_kernel[(N,)](
        x, y_arg, weight, res, out,
        x.stride(0), y_arg.stride(0), res.stride(0), out.stride(0),
        H, eps, HAS_RESIDUAL=y is not None, BLOCK_H=BLOCK_H, num_warps=NUM_WARPS,
    )
    return out, res
