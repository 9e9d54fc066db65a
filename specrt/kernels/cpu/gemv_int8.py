"""y = x @ W^T + b with W in int8, for a draft model on the CPU.

The weight is quantized once, per output row (symmetric: scale = max|W[n, :]| / 127, values
rounded half to even into -127..127, stored + 128 as uint8). Each call quantizes x per row and
per block of 64 values the same way, and
    y[m, n] = w_scale[n] * sum_b x_scale[m, b] * (exact integer dot of block b) (+ bias[n]),
the sum over b taken in block order in fp32, each product and each sum rounded.
`reference_linear` is that definition in PyTorch (the specification, and the path where the C++
kernel does not run); `kernel_linear` is csrc/cpu/gemv_int8.cpp. With AVX-512 VNNI it stores the
weight packed 16 rows to a group (PACK_ROWS; `quantize` packs) and gives the reference's bits; on
AVX2 (row-major weight) its fp32 sums run in another fixed order. Where the CPU has AMX,
passes of AMX_ROWS rows or more run on its tiles (csrc/cpu/gemv_int8_amx.cpp), with the same
bits. Either way each row's bits are independent of M.

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
# The weight layout the kernel reads here (`quantize` stores it): rows in groups of PACK_ROWS,
# data [ceil(N / 16), K / 4, 16, 4] with w[g, k / 4, r, k % 4] = W[16 g + r, k] (AVX-512 VNNI),
# or 0: row-major [N, K] (AVX2, and where no kernel runs).
PACK_ROWS = int(_gemv.int8_packed_rows()) if AVAILABLE else 0
# From how many rows of x (a prompt's pass) the packed kernel runs on AMX tiles, with the same
# bits (csrc/cpu/gemv_int8_amx.cpp); 0: never here (no AMX-INT8, or SPECRT_AMX=0).
AMX_ROWS = int(_gemv.int8_amx_rows()) if PACK_ROWS else 0


def data_shape(N: int, K: int, packed_rows: int = PACK_ROWS) -> tuple[int, ...]:
    """The shape of an int8 weight [N, K]'s data in a layout (default: the kernel's here)."""
    return (-(-N // packed_rows), K // 4, packed_rows, 4) if packed_rows else (N, K)


@dataclasses.dataclass(frozen=True)
class Int8Weight:
    data: torch.Tensor      # uint8, the int8 value + 128: [N, K], or packed (PACK_ROWS)
    scale: torch.Tensor     # [N] fp32
    packed_rows: int = 0    # 0: data [N, K]; 16: data [ceil(N / 16), K / 4, 16, 4] (PACK_ROWS)

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of the weight it stands for."""
        if self.packed_rows:
            return (self.scale.shape[0], self.data.shape[1] * 4)
        return tuple(self.data.shape)

    def rows(self) -> torch.Tensor:
        """data as [N, K] (row-major; a copy if packed)."""
        if not self.packed_rows:
            return self.data
        G, K4, R, _ = self.data.shape
        return self.data.permute(0, 2, 1, 3).reshape(G * R, K4 * 4)[:self.shape[0]]

    @property
    def nbytes(self) -> int:
        return self.data.numel() + 4 * self.scale.numel()


def quantize(weight: torch.Tensor, packed_rows: int | None = None) -> Int8Weight:
    """[N, K] float weight -> its per-row symmetric int8 form, in the layout the kernel reads
    here (packed_rows None: PACK_ROWS; 0: row-major; 16: packed, K a multiple of 4)."""
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.is_floating_point()
            and weight.numel()):
        raise ValueError(f"quantize: weight must be a non-empty 2-D float tensor, got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    data = torch.empty(weight.shape, dtype=torch.uint8, device=weight.device)
    scale = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for n0 in range(0, weight.shape[0], 4096):          # bounded fp32 temporaries
        w = weight[n0:n0 + 4096].float()                                   # [n, K]
        amax = w.abs().amax(dim=1)                                         # [n]
        inv = _inverse_scale(amax)
        data[n0:n0 + 4096] = (torch.round(w * inv[:, None]).clamp_(-127, 127) + 128).to(torch.uint8)
        scale[n0:n0 + 4096] = amax / 127.0
    if packed_rows is None:   # the kernel's layout; K % 4 != 0 is no kernel's (K % 64 == 0)
        packed_rows = PACK_ROWS if weight.shape[1] % 4 == 0 else 0
    return pack(Int8Weight(data, scale), packed_rows) if packed_rows else Int8Weight(data, scale)


def pack(weight: Int8Weight, rows: int = 16) -> Int8Weight:
    """A row-major Int8Weight in groups of `rows` rows (the rows past N: 128, zero weights)."""
    if weight.packed_rows or weight.shape[1] % 4:
        raise ValueError(f"pack: needs a row-major weight with K a multiple of 4, got "
                         f"{tuple(weight.data.shape)} (packed_rows={weight.packed_rows})")
    N, K = weight.shape
    G = data_shape(N, K, rows)[0]
    data = torch.full((G * rows, K), 128, dtype=torch.uint8, device=weight.data.device)
    data[:N] = weight.data
    data = data.view(G, rows, K // 4, 4).permute(0, 2, 1, 3).contiguous()   # [G, K/4, rows, 4]
    return Int8Weight(data, weight.scale, rows)


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
    return (q.view(q.shape[0], s.shape[1], BLOCK) * s[..., None]).view(q.shape)


def _inverse_scale(amax: torch.Tensor) -> torch.Tensor:
    """127 / amax as one correctly rounded fp32 division, as the kernel computes it (Python's
    `127.0 / t` is t.reciprocal() * 127 in PyTorch: two roundings), 0 where amax is 0."""
    inv = torch.full_like(amax, 127.0).div_(amax)
    return torch.where(amax > 0, inv, torch.zeros_like(amax))


def reference_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The specification: x [..., K] (K % 64 == 0) quantized per block as above, each block's
    integer dot with the weight row (exact in fp32: |dot| <= 64 * 127 * 127 < 2^24, in any
    order), times the block's scale, summed over the blocks in order in fp32 (torch's
    elementwise mul and add: each rounded once), times the row's scale, + bias."""
    _check(x, weight, bias, out_dtype)
    N, K = weight.shape
    q, s = quantize_rows(x.reshape(-1, K))                                 # [M, K], [M, B]
    w = weight.rows().float().sub_(128.0)                                  # [N, K] integers
    y = torch.zeros(q.shape[0], N)                                         # [M, N]
    for b in range(K // BLOCK):
        cols = slice(b * BLOCK, (b + 1) * BLOCK)
        y = y + F.linear(q[:, cols], w[:, cols]) * s[:, b:b + 1]
    y = y * weight.scale
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype).view(*x.shape[:-1], y.shape[-1])   # [..., N]


def kernel_linear(x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """csrc/cpu/gemv_int8.cpp; ValueError for what it does not serve."""
    fn = "int8 kernel_linear"
    checks.require(AVAILABLE, fn, "specrt._gemv (with AVX-512 VNNI or AVX2)")
    _check(x, weight, bias, out_dtype)
    if weight.packed_rows != PACK_ROWS:
        raise checks.fail(fn, "weight", f"packed_rows={PACK_ROWS}, the layout the kernel reads "
                          "here (gemv_int8.quantize stores it)", weight.packed_rows)
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
    dims = 4 if weight.packed_rows else 2
    if not (isinstance(weight.data, torch.Tensor) and isinstance(weight.scale, torch.Tensor)
            and weight.data.dim() == dims and weight.scale.dim() >= 1):
        raise checks.fail(fn, "weight", f"uint8 data of {dims} dims and an fp32 scale",
                          describe(weight))
    N, K = weight.shape
    layout = data_shape(N, K, weight.packed_rows)
    if not (weight.data.dtype == torch.uint8 and weight.data.is_contiguous()
            and weight.data.shape == layout and weight.scale.dtype == torch.float32
            and weight.scale.shape == (N,) and weight.scale.is_contiguous()
            and weight.data.is_cpu and weight.scale.is_cpu):
        raise checks.fail(fn, "weight", f"uint8 data {list(layout)} and contiguous fp32 scale "
                          "[N], both on the CPU", describe(weight))
    if K % BLOCK:
        raise checks.fail(fn, "weight", f"[N, K] with K a multiple of {BLOCK}", f"K = {K}")
    check_operands(fn, x, N, K, bias, out_dtype)


def describe(weight) -> str:
    """A quantized weight's data and scale as an error shows them (int8 here, int4 in
    gemv_int4): dtype, shape and device of each."""
    return ", ".join(f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor)
                     else type(t).__name__ for t in (weight.data, weight.scale))


def check_operands(fn: str, x, N: int, K: int, bias, out_dtype) -> None:
    """x [..., K] bf16/fp32, bias [N] like x or None, out_dtype x's or fp32 or None: what a
    quantized product takes besides its weight (int8 here, int4 in gemv_int4)."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != K:
        raise checks.fail(fn, "x", f"[..., {K}]", f"shape {tuple(getattr(x, 'shape', ()))}")
    if x.dtype not in checks.FLOATS:
        raise checks.fail(fn, "x", "bfloat16 or float32", x.dtype)
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.shape == (N,)
                                 and bias.dtype == x.dtype and bias.is_contiguous()
                                 and bias.is_cpu):
        raise checks.fail(fn, "bias", f"[{N}] contiguous {x.dtype} like x, on the CPU",
                          f"{getattr(bias, 'dtype', None)} {tuple(getattr(bias, 'shape', ()))}")
    if out_dtype not in (None, x.dtype, torch.float32):
        raise checks.fail(fn, "out_dtype", f"{x.dtype} (that of x) or torch.float32", out_dtype)
