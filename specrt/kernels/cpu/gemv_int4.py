"""y = x @ W^T + b with W in int4, for a draft model on the CPU.

The weight is quantized once, per output row and per group of GROUP = 64 values: symmetric,
scale = max|group| / 7, values rounded half to even into -7..7 (a search for the scale of least
squared error per group, and asymmetric groups, measured no better acceptance on the default
pair: benchmarks/RESULTS.md, "Int4 draft"). Storage, per row: in
each chunk of 128 values, byte t holds value t + 8 in its low nibble and value 64 + t + 8 in
its high nibble; scales fp32 [N, K / 64]. Each call quantizes x per row and per block of 64
exactly as the int8 kernel does (`gemv_int8.quantize_rows`), and
    y[m, n] = sum_b w_scale[n, b] * x_scale[m, b] * (exact integer dot of block b) (+ bias[n]).
`reference_linear` is that definition in PyTorch (the specification, and the path where the
C++ kernel does not run); `kernel_linear` is csrc/cpu/gemv_int4.cpp (AVX-512 VNNI), equal to
the reference up to fp32 summation order, and giving each row the same bits whatever M is.

Only a draft model runs this. The draft's numbers decide which tokens are proposed, never which
are emitted, so greedy speculative output stays identical to plain decoding of the unquantized
target and sampling stays exact (q is what the quantized draft computed).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from specrt.kernels.cpu import checks
from specrt.kernels.cpu.gemv import AVAILABLE as _GEMV_AVAILABLE, _gemv
from specrt.kernels.cpu.gemv_int8 import (BLOCK, call_kernel, check_operands, dequantized_rows,
                                          describe)

# int4 runs with AVX-512 VNNI only (no AVX2 variant: on such CPUs int8 is the quantized draft).
AVAILABLE = _GEMV_AVAILABLE and bool(_gemv.int4_supported())

GROUP = BLOCK       # weight values per scale: one activation block
CHUNK = 2 * GROUP   # values per packed chunk; K must be a multiple of it

__all__ = ["AVAILABLE", "CHUNK", "GROUP", "Int4Weight", "quantize", "dequantize",
           "reference_linear", "kernel_linear", "linear"]


@dataclasses.dataclass(frozen=True)
class Int4Weight:
    data: torch.Tensor      # [N, K / 2] uint8: two values + 8 per byte (see the module doc)
    scale: torch.Tensor     # [N, K / 64] fp32

    @property
    def shape(self) -> tuple[int, int]:
        return (self.data.shape[0], 2 * self.data.shape[1])

    @property
    def nbytes(self) -> int:
        return self.data.numel() + 4 * self.scale.numel()


def quantize(weight: torch.Tensor) -> Int4Weight:
    """[N, K] float weight (K % 128 == 0) -> its int4 form (per-group scales)."""
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.is_floating_point()
            and weight.numel()):
        raise ValueError(f"quantize: weight must be a non-empty 2-D float tensor, got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    N, K = weight.shape
    if K % CHUNK:
        raise ValueError(f"quantize: int4 weights need K a multiple of {CHUNK}, got K = {K}")
    data = torch.empty(N, K // 2, dtype=torch.uint8, device=weight.device)
    scale = torch.empty(N, K // GROUP, dtype=torch.float32, device=weight.device)
    for n0 in range(0, N, 4096):                        # bounded fp32 temporaries
        w = weight[n0:n0 + 4096].float().view(-1, K // GROUP, GROUP)       # [n, G, 64]
        amax = w.abs().amax(dim=-1, keepdim=True)                          # [n, G, 1]
        inv = torch.full_like(amax, 7.0).div_(amax)                        # one rounding
        inv = torch.where(amax > 0, inv, torch.zeros_like(inv))
        q = torch.round(w * inv).clamp_(-7, 7)                             # [n, G, 64]
        u = (q + 8).to(torch.uint8).view(-1, K // CHUNK, 2, GROUP)         # [n, C, 2, 64]
        data[n0:n0 + 4096] = (u[:, :, 0] | (u[:, :, 1] << 4)).view(-1, K // 2)
        scale[n0:n0 + 4096] = (amax / 7.0).view(-1, K // GROUP)
    return Int4Weight(data, scale)


def dequantize(weight: Int4Weight) -> torch.Tensor:
    """The fp32 values [N, K] an Int4Weight stands for."""
    N, K = weight.shape
    d = weight.data.view(N, K // CHUNK, 1, GROUP)                          # [N, C, 1, 64]
    q = torch.cat([d & 0x0F, d >> 4], dim=2).float().sub_(8.0)             # [N, C, 2, 64]
    return (q.view(N, K // GROUP, GROUP) * weight.scale[..., None]).view(N, K)


def reference_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The specification: x [..., K] @ dequantized W^T, x quantized per block of 64."""
    _check(x, weight, bias, out_dtype)
    xd = dequantized_rows(x.reshape(-1, x.shape[-1]))                      # [M, K]
    y = F.linear(xd, dequantize(weight))                                   # [M, N]
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype).view(*x.shape[:-1], y.shape[-1])   # [..., N]


def kernel_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """csrc/cpu/gemv_int4.cpp; ValueError for what it does not serve."""
    fn = "int4 kernel_linear"
    checks.require(AVAILABLE, fn, "specrt._gemv (with AVX-512 VNNI)")
    _check(x, weight, bias, out_dtype)
    return call_kernel(fn, _gemv.gemv_int4, x, weight, bias, out_dtype)


def linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The kernel where it runs (CPU with AVX-512 VNNI, extension built), else the reference."""
    if AVAILABLE and x.is_cpu and x.dtype in checks.FLOATS and x.numel():
        return kernel_linear(x, weight, bias, out_dtype)
    return reference_linear(x, weight, bias, out_dtype)


def _check(x, weight: Int4Weight, bias, out_dtype) -> None:
    fn = "int4 linear"
    if not isinstance(weight, Int4Weight):
        raise checks.fail(fn, "weight", "an Int4Weight (gemv_int4.quantize)", type(weight).__name__)
    if not (isinstance(weight.data, torch.Tensor) and isinstance(weight.scale, torch.Tensor)
            and weight.data.dim() == 2 and weight.scale.dim() >= 1):
        raise checks.fail(fn, "weight", "uint8 data of 2 dims and an fp32 scale",
                          describe(weight))
    N, K = weight.shape
    if not (weight.data.dtype == torch.uint8 and weight.data.is_contiguous()
            and weight.scale.dtype == torch.float32 and weight.scale.is_contiguous()
            and weight.scale.shape == (N, K // GROUP) and K % CHUNK == 0
            and weight.data.is_cpu and weight.scale.is_cpu):
        raise checks.fail(fn, "weight", f"uint8 data [N, K / 2] and fp32 scale [N, K / {GROUP}] "
                          f"with K a multiple of {CHUNK}, both on the CPU", describe(weight))
    check_operands(fn, x, N, K, bias, out_dtype)
