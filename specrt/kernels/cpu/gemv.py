"""y = x @ W^T + b for decode and verify on the CPU, through specrt._gemv when it can.

`F.linear` is the specification and the fallback. The C++ kernels (csrc/cpu/gemv.cpp) stream the
weight once per call for the skinny inputs of decode (M = 1) and verify (M = K + 1), and give
each row the same bits whatever M is.
They serve contiguous bf16 and fp32 inputs on CPUs with AVX-512 BF16, up to MAX_ROWS rows;
anything else (other dtypes, CUDA tensors, prefills, a missing extension) takes `F.linear`.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

try:
    from specrt import _gemv

    AVAILABLE = bool(_gemv.cpu_supported()) and os.environ.get("SPECRT_CPU_GEMV", "1") != "0"
except ImportError:     # extension not built: every call takes the library path
    _gemv = None
    AVAILABLE = False

# Up to how many rows of x the kernel beats the library GEMM, measured on the development
# machine (AMD EPYC, AVX-512 BF16, 2 threads, all of the 1.5B target's weights streamed per
# call; see benchmarks/RESULTS.md). bf16: 0.55x oneDNN's time for one row, 0.6-0.8x for verify
# sizes (2-17 rows), even at 32 and behind from 33. fp32: MKL re-reads the weight for each few
# rows, so the kernel stays ahead (0.6-0.8x) up to 64 rows. Prefills take the library GEMM.
MAX_ROWS = {torch.bfloat16: 32, torch.float32: 64}


def build_id() -> str:
    """Which build serves the kernel path: the extension's source hash, "library" for F.linear."""
    return _gemv.build_id() if AVAILABLE else "library"


def usable(weight: torch.Tensor) -> bool:
    return (AVAILABLE and weight.device.type == "cpu" and weight.is_contiguous()
            and weight.dtype in (torch.bfloat16, torch.float32))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias [N]) -> [..., N] in out_dtype (default x.dtype).

    out_dtype=torch.float32 with bf16 inputs keeps the fp32 accumulator (used for logits)."""
    out_dtype = out_dtype or x.dtype
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    if not (usable(weight) and x.dtype == weight.dtype and 0 < rows <= MAX_ROWS[weight.dtype]
            and (bias is None or (bias.dtype == weight.dtype and bias.is_contiguous()))
            and out_dtype in (x.dtype, torch.float32)):
        y = F.linear(x, weight, bias)
        return y if y.dtype == out_dtype else y.to(out_dtype)
    return kernel_linear(x, weight, bias, out_dtype)


def kernel_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The C++ kernel itself, whatever the number of rows (callers check `usable` and dtypes).
    Each output row is computed the same way whatever M is."""
    out_dtype = out_dtype or x.dtype
    rows = x.numel() // x.shape[-1]
    n, k = weight.shape
    x2 = x.reshape(rows, k).contiguous()                         # [M, K]
    out = torch.empty(rows, n, dtype=out_dtype)                  # [M, N]
    b = bias.data_ptr() if bias is not None else 0
    threads = torch.get_num_threads()
    if weight.dtype == torch.bfloat16:
        _gemv.gemv_bf16(x2.data_ptr(), weight.data_ptr(), b, out.data_ptr(),
                        out_dtype == torch.float32, rows, n, k, threads)
    elif out_dtype == torch.float32:
        _gemv.gemv_f32(x2.data_ptr(), weight.data_ptr(), b, out.data_ptr(), rows, n, k, threads)
    else:
        raise AssertionError("unreachable: fp32 weights give fp32 outputs")
    return out.view(*x.shape[:-1], n)
