"""Triton kernel: SiLU(gate) * up, the SwiGLU activation between the MLP's two matmuls.

    out[n, i] = silu(gu[n, i]) * gu[n, I + i],   silu(g) = g / (1 + exp(-g))

on the fused gate/up projection's output [N, 2 I] (gate first). SiLU is rounded to the input
dtype before the product, as the reference (`reference_layer.silu_mul`) does. Elementwise, so
trivially batch invariant.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from specrt.kernels.checks import require, require_runnable

__all__ = ["silu_mul", "DTYPES", "BLOCK", "NUM_WARPS"]

# What the launcher can pick; `specrt.kernels.compile_check` compiles exactly these.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BLOCK = 1024
NUM_WARPS = 4


@triton.jit(do_not_specialize=["I"])
def _silu_mul_kernel(
    gu_ptr, out_ptr,  # gu [N, 2 I], out [N, I]
    stride_g, stride_o,
    I,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(gu_ptr + row * stride_g + cols, mask=mask, other=0.0)
    u = tl.load(gu_ptr + row * stride_g + I + cols, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)
    out = act.to(tl.float32) * u.to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:  # [N, 2 I] -> [N, I]
    """Launch the kernel; see the module docstring for the math."""
    require(gate_up.dim() == 2 and gate_up.stride(-1) == 1, "gate_up must be [N, 2 I], contiguous")
    N, I2 = gate_up.shape
    require(I2 % 2 == 0, f"gate_up width {I2} is not even")
    require(gate_up.dtype in DTYPES, f"unsupported dtype {gate_up.dtype}")
    require_runnable(gate_up)
    I = I2 // 2
    out = torch.empty((N, I), device=gate_up.device, dtype=gate_up.dtype)
    _silu_mul_kernel[(N, triton.cdiv(I, BLOCK))](
        gate_up, out, gate_up.stride(0), out.stride(0), I, BLOCK=BLOCK, num_warps=NUM_WARPS,
    )
    return out
