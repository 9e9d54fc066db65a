"""y = x @ W^T + b for decode and verify on the CPU, through specrt._gemv when it can.

`F.linear` is the specification and the fallback. The C++ kernels (csrc/cpu/gemv.cpp) stream the
weight once per call for the skinny inputs of decode (M = 1) and verify (M = K + 1), and give
each row the same bits whatever M is.
They serve contiguous bf16 and fp32 inputs on CPUs with AVX-512 BF16 or AVX2 + FMA (`LEVEL`),
up to MAX_ROWS rows (any number when fp32 results are asked for: logits); anything else (other
dtypes, CUDA tensors, prefills where the library is faster, a missing extension) takes
`F.linear`.
Mismatched operands raise ValueError on every path, before a pointer reaches C++.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from specrt.kernels.cpu import checks, extension

# Not built, or this CPU has neither AVX-512 BF16 nor AVX2: every call takes the library path.
_gemv, AVAILABLE = extension.load("specrt._gemv", "SPECRT_CPU_GEMV",
                                  "the C++ decode/verify matrix products", "F.linear")
LEVEL = _gemv.cpu_level() if AVAILABLE else "none"      # "avx512", "avx2" or "none"

# Up to how many rows of x the kernel beats the library GEMM, measured on the development
# machine (AMD EPYC, AVX-512 BF16, 2 threads, all of the 1.5B target's weights streamed per
# call; see benchmarks/RESULTS.md). bf16: 0.55x oneDNN's time for one row, 0.6-0.8x for verify
# sizes (2-17 rows), even at 32 and behind from 33. fp32: MKL re-reads the weight for each few
# rows, so the kernel stays ahead (0.6-0.8x) up to 64 rows. Prefills take the library GEMM.
# Without AVX-512 BF16 the library has no fast bf16 path at all: on an AVX2-only CPU (AMD
# EPYC, 2 threads, a 8960 x 1536 weight) oneDNN's bf16 GEMM ran at 11 GFLOP/s and the AVX2
# kernel at 44-54 (0.34-0.39x its time from 5 to 200 rows, 1.0x at 1 row), so the kernel takes
# every bf16 call there, prefills included; fp32 keeps 64 (at 200 rows MKL is 1.7x faster).
MAX_ROWS = ({torch.bfloat16: 32, torch.float32: 64} if LEVEL != "avx2"
            else {torch.bfloat16: 1 << 16, torch.float32: 64})

# From how many tokens a bf16 prompt prefilled alone takes the library GEMM instead of these
# kernels, for a model on them (a model packed for AMX tiles runs every pass there, `gemv_amx`;
# this serves `CpuNative(amx=False)`, a compiler without AMX, a qkv the tiles do not take):
# where the CPU has AMX-BF16 (oneDNN's bf16 GEMM runs on its tiles) the kernels, whose time
# grows by ~a third of a decode step a row, fall behind from ~9 rows: on a Xeon with AMX (the
# 1.5B target, one prompt's pass, medians of 3 interleaved runs) 8 tokens 156 ms on the kernels
# / 158 ms on oneDNN, 12 214 / 166, 16 287 / 172, 24 423 / 176, 32 569 / 186 ms
# (benchmarks/RESULTS.md, "oneDNN for a bf16 prompt of 9-32 tokens"). Elsewhere MAX_ROWS + 1:
# the library from where it takes every bf16 pass. Only a pass alone may take it (its bits
# differ from the kernels'): `specrt.model.backends.cpu_native`.
PROMPT_LIBRARY_ROWS = 9 if AVAILABLE and _gemv.amx_bf16() else MAX_ROWS[torch.bfloat16] + 1


def build_id() -> str:
    """Which build serves the kernel path: the extension's source hash, "library" for F.linear."""
    return _gemv.build_id() if AVAILABLE else "library"


def usable(weight: torch.Tensor) -> bool:
    return (AVAILABLE and weight.device.type == "cpu" and weight.is_contiguous()
            and weight.dtype in (torch.bfloat16, torch.float32))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias [N]) -> [..., N] in out_dtype (default x.dtype).

    out_dtype=torch.float32 with bf16 inputs keeps the fp32 accumulator (used for logits).
    Any device and layout: what the kernel does not serve takes `F.linear`."""
    _check_operands("linear", x, weight, bias)
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise checks.fail("linear", "out_dtype", "a torch.dtype or None", out_dtype)
    # Asked-for fp32 results (logits) take the kernel at any row count: a batch's logits must
    # be the bits of each row alone (and the library would round bf16 products to bf16 first).
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    most = rows if out_dtype == torch.float32 else MAX_ROWS.get(weight.dtype, 0)
    out_dtype = out_dtype or x.dtype
    # the kernel records no autograd graph: a product that needs one takes the library
    tracked = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias))
    if not (usable(weight) and 0 < rows <= most and not tracked
            and (bias is None or bias.is_contiguous()) and out_dtype in (x.dtype, torch.float32)):
        y = F.linear(x, weight, bias)
        return y if y.dtype == out_dtype else y.to(out_dtype)
    return kernel_linear(x, weight, bias, out_dtype)


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The C++ kernel itself, whatever the number of rows; raises ValueError for what it does
    not serve (see `usable`; x may have any strides: it is copied to rows if it must be).
    Each output row is computed the same way whatever M is."""
    fn = "kernel_linear"
    checks.require(AVAILABLE, fn, "specrt._gemv (AVX-512 BF16, or AVX2 + FMA + F16C)")
    _check_operands(fn, x, weight, bias)
    checks.floating(fn, "weight", weight, "[N, K]")
    n, k = weight.shape
    if bias is not None:
        checks.tensor(fn, "bias", bias, weight.dtype, (n,), "[N]", "weight")
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (x.dtype, torch.float32):
        expected = ("torch.float32 (that of x)" if x.dtype == torch.float32
                    else f"{x.dtype} (that of x) or torch.float32")
        raise checks.fail(fn, "out_dtype", expected, out_dtype)
    if not x.is_cpu:
        raise checks.fail(fn, "x", "on the CPU", x.device)
    rows = x.numel() // k if k else 0
    if rows == 0:
        raise checks.fail(fn, "x", "[..., K] with at least one row and K >= 1",
                          f"shape {tuple(x.shape)}")
    x2 = x.reshape(rows, k).contiguous()                         # [M, K]
    out = torch.empty(rows, n, dtype=out_dtype)                  # [M, N]
    b = bias.data_ptr() if bias is not None else 0
    threads = torch.get_num_threads()
    if weight.dtype == torch.bfloat16:
        _gemv.gemv_bf16(x2.data_ptr(), weight.data_ptr(), b, out.data_ptr(),
                        out_dtype == torch.float32, rows, n, k, threads)
    else:                                  # fp32 weights: out_dtype is fp32, checked above
        _gemv.gemv_f32(x2.data_ptr(), weight.data_ptr(), b, out.data_ptr(), rows, n, k, threads)
    return out.view(*x.shape[:-1], n)


def _check_operands(fn: str, x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor | None) -> None:
    """What every path needs, on any device: x [..., K], weight [N, K], bias [N], one dtype."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, torch.Tensor) and (t is not None or name != "bias"):
            raise checks.fail(fn, name, "a torch.Tensor", type(t).__name__)
    if weight.dim() != 2:
        raise checks.fail(fn, "weight", "2-D [N, K]", f"shape {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise checks.fail(fn, "x", f"[..., K] with K = {weight.shape[1]} (weight [N, K])",
                          f"shape {tuple(x.shape)}")
    if x.dtype != weight.dtype:
        raise checks.fail(fn, "x", f"{weight.dtype} like weight", x.dtype)
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != weight.dtype):
        raise checks.fail(fn, "bias", f"[N] = ({weight.shape[0]},) of {weight.dtype} like weight",
                          f"shape {tuple(bias.shape)} of {bias.dtype}")
