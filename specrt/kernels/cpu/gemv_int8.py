"""y = x @ W^T + b with W in int8, for a draft model on the CPU.

The weight is quantized once, per output row (symmetric: scale = max|W[n, :]| / 127, values
rounded half to even into -127..127, stored + 128 as uint8). Each call quantizes x per row and
per block of 64 values the same way, and
    y[m, n] = w_scale[n] * sum_b x_scale[m, b] * (exact integer dot of block b) (+ bias[n]).
`reference_linear` is that definition in PyTorch (the specification, and the path where the C++
kernel does not run); `kernel_linear` is csrc/cpu/gemv_int8.cpp (AVX-512 VNNI), equal to the
reference up to fp32 summation order, and giving each row the same bits whatever M is.

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

# The same extension as the bf16 kernels (specrt._gemv): with AVX-512 VNNI (vpdpbusd), or on
# AVX2 (csrc/cpu/gemv_int8_avx2.cpp: the same integer block dots, widened to 16 bits).
AVAILABLE = _GEMV_AVAILABLE and bool(_gemv.int8_supported())
BLOCK = 64          # activation values per scale; K must be a multiple of it for the kernel


@dataclasses.dataclass(frozen=True)
class Int8Weight:
    data: torch.Tensor      # [N, K] uint8: the int8 value + 128
    scale: torch.Tensor     # [N] fp32

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    @property
    def nbytes(self) -> int:
        return self.data.numel() + 4 * self.scale.numel()


def quantize(weight: torch.Tensor) -> Int8Weight:
    """[N, K] float weight -> its per-row symmetric int8 form."""
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.is_floating_point()):
        raise ValueError(f"quantize: weight must be a 2-D float tensor, got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    data = torch.empty(weight.shape, dtype=torch.uint8, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for n0 in range(0, weight.shape[0], 4096):          # bounded fp32 temporaries
        w = weight[n0:n0 + 4096].float()                                   # [n, K]
        amax = w.abs().amax(dim=1)                                         # [n]
        inv = _inverse_scale(amax)
        data[n0:n0 + 4096] = (torch.round(w * inv[:, None]).clamp_(-127, 127) + 128).to(torch.uint8)
        scale[n0:n0 + 4096] = amax / 127.0
    return Int8Weight(data, scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] fp32 integer values, scale [M, K / BLOCK]) per block of BLOCK."""
    M, K = x.shape
    blocks = x.float().view(M, K // BLOCK, BLOCK)                          # [M, B, 64]
    amax = blocks.abs().amax(dim=-1)                                       # [M, B]
    inv = _inverse_scale(amax)
    q = torch.round(blocks * inv[..., None]).clamp_(-127, 127)
    return q.view(M, K), amax / 127.0


def dequantized_rows(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> the fp32 values [M, K] its per-block quantization stands for."""
    q, s = quantize_rows(x)                                                # [M, K], [M, B]
    return (q.view(q.shape[0], -1, BLOCK) * s[..., None]).view(q.shape)


def _inverse_scale(amax: torch.Tensor) -> torch.Tensor:
    """127 / amax as one correctly rounded fp32 division, as the kernel computes it (Python's
    `127.0 / t` is t.reciprocal() * 127 in PyTorch: two roundings), 0 where amax is 0."""
    inv = torch.full_like(amax, 127.0).div_(amax)
    return torch.where(amax > 0, inv, torch.zeros_like(amax))


def reference_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The specification: x [..., K] (K % 64 == 0) @ dequantized W^T, x quantized as above."""
    _check(x, weight, bias, out_dtype)
    xd = dequantized_rows(x.reshape(-1, x.shape[-1]))                      # [M, K]
    w = weight.data.float().sub_(128.0)                                    # [N, K] integers
    y = F.linear(xd, w) * weight.scale                                     # [M, N]
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype).view(*x.shape[:-1], -1)


def kernel_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """csrc/cpu/gemv_int8.cpp; ValueError for what it does not serve."""
    fn = "int8 kernel_linear"
    checks.require(AVAILABLE, fn, "specrt._gemv (with AVX-512 VNNI or AVX2)")
    _check(x, weight, bias, out_dtype)
    return call_kernel(fn, _gemv.gemv_int8, x, weight, bias, out_dtype)


def call_kernel(fn: str, kernel, x: torch.Tensor, weight, bias: torch.Tensor | None,
                out_dtype: torch.dtype | None) -> torch.Tensor:
    """Run a quantized product of specrt._gemv (gemv_int8 here, gemv_int4 in gemv_int4: the
    same arguments) on operands its wrapper has checked; x must be on the CPU."""
    if not x.is_cpu:
        raise checks.fail(fn, "x", "on the CPU", x.device)
    out_dtype = out_dtype or x.dtype
    N, K = weight.shape
    x2 = x.reshape(-1, K).contiguous()                                     # [M, K]
    out = torch.empty(x2.shape[0], N, dtype=out_dtype)                     # [M, N]
    kernel(x2.data_ptr(), x.dtype == torch.float32, weight.data.data_ptr(),
           weight.scale.data_ptr(), bias.data_ptr() if bias is not None else 0,
           out.data_ptr(), out_dtype == torch.float32, x2.shape[0], N, K,
           torch.get_num_threads())
    return out.view(*x.shape[:-1], N)


def linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The kernel where it runs (CPU with AVX-512 VNNI or AVX2, extension built), else the
    reference."""
    if AVAILABLE and x.is_cpu and x.dtype in checks.FLOATS and x.numel():
        return kernel_linear(x, weight, bias, out_dtype)
    return reference_linear(x, weight, bias, out_dtype)


def _check(x, weight: Int8Weight, bias, out_dtype) -> None:
    fn = "int8 linear"
    if not isinstance(weight, Int8Weight):
        raise checks.fail(fn, "weight", "an Int8Weight (gemv_int8.quantize)", type(weight).__name__)
    N, K = weight.shape
    if not (weight.data.dtype == torch.uint8 and weight.data.is_contiguous()
            and weight.scale.dtype == torch.float32 and weight.scale.shape == (N,)):
        raise checks.fail(fn, "weight", "uint8 data [N, K] and fp32 scale [N]",
                          f"{weight.data.dtype} {tuple(weight.data.shape)}, "
                          f"{weight.scale.dtype} {tuple(weight.scale.shape)}")
    if K % BLOCK:
        raise checks.fail(fn, "weight", f"[N, K] with K a multiple of {BLOCK}", f"K = {K}")
    check_operands(fn, x, N, K, bias, out_dtype)


def check_operands(fn: str, x, N: int, K: int, bias, out_dtype) -> None:
    """x [..., K] bf16/fp32, bias [N] like x or None, out_dtype x's or fp32 or None: what a
    quantized product takes besides its weight (int8 here, int4 in gemv_int4)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != K:
        raise checks.fail(fn, "x", f"[..., {K}]", f"shape {tuple(getattr(x, 'shape', ()))}")
    if x.dtype not in checks.FLOATS:
        raise checks.fail(fn, "x", "bfloat16 or float32", x.dtype)
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.shape == (N,)
                                 and bias.dtype == x.dtype and bias.is_contiguous()):
        raise checks.fail(fn, "bias", f"[{N}] contiguous {x.dtype} like x",
                          f"{getattr(bias, 'dtype', None)} {tuple(getattr(bias, 'shape', ()))}")
    if out_dtype not in (None, x.dtype, torch.float32):
        raise checks.fail(fn, "out_dtype", f"{x.dtype} (that of x) or torch.float32", out_dtype)
