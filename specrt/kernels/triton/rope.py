"""Triton helper: the bias + rotary embedding of one head for a tile of rows, in fp32.

Called from inside kernels (it is a `@triton.jit` function, not a launcher). The math is
`reference_layer.qkv_rope`'s: with x the projection output plus its bias, in fp32,

    out[d] = x[d] * cos[pos, d] + rot(x)[d] * sin[pos, d],
    rot(x)[d] = -x[d + D/2] for d < D/2, x[d - D/2] otherwise      (rotate-half, Qwen2/Llama)

Each element is computed on its own, so a row's result never depends on the other rows of
the tile (or on how many there are).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def roped_rows(
    row_ptrs,      # [R] pointers to each row's head (HEAD_DIM contiguous elements)
    bias_ptrs,     # [R] pointers to that head's bias
    table_rows,    # [R] int64 element offsets of each row's position in the cos/sin tables
    cos_ptr, sin_ptr,
    mask,          # [R] bool, rows to load (others give 0)
    HEAD_DIM: tl.constexpr,
):  # -> [R, HEAD_DIM] fp32
    HALF: tl.constexpr = HEAD_DIM // 2
    offs = tl.arange(0, HEAD_DIM)
    rot = (offs + HALF) % HEAD_DIM
    m2 = mask[:, None]
    x = (tl.load(row_ptrs[:, None] + offs[None, :], mask=m2, other=0.0).to(tl.float32)
         + tl.load(bias_ptrs[:, None] + offs[None, :], mask=m2, other=0.0).to(tl.float32))
    xr = (tl.load(row_ptrs[:, None] + rot[None, :], mask=m2, other=0.0).to(tl.float32)
          + tl.load(bias_ptrs[:, None] + rot[None, :], mask=m2, other=0.0).to(tl.float32))
    xr = tl.where(offs[None, :] < HALF, -xr, xr)
    c = tl.load(cos_ptr + table_rows[:, None] + offs[None, :], mask=m2, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + table_rows[:, None] + offs[None, :], mask=m2, other=0.0).to(tl.float32)
    return x * c + xr * s
