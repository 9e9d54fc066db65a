"""A fixed summation order for `tl.dot` under the Triton interpreter.

The interpreter computes `tl.dot` with numpy's matmul, i.e. the CPU's BLAS, and some BLAS
kernels (OpenBLAS's AVX2 ones on AMD Zen, seen 2026-12-01) round an output element
differently depending on its row's position in the block. A GPU's MMA sums every element of
a tile in one order wherever it sits, and the batch-invariance tests (a verify pass's rows
have the bits of the decode steps they replace) test the kernels' own structure: their tiles,
splits and reduction order, not the BLAS under the interpreter. So the tests run the
interpreter with a dot that sums each element over k = 0, 1, ... in order, in the accumulator's
dtype, starting from the accumulator: the same bits for a row wherever it sits, on every CPU.
"""
from __future__ import annotations

import numpy as np


def _dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    from triton.runtime.interpreter import TensorHandle, _convert_float, tl

    a_data, b_data = a.data, b.data
    if (a.dtype.primitive_bitwidth == 8 and a.dtype.is_floating()) or \
       (b.dtype.primitive_bitwidth == 8 and b.dtype.is_floating()):
        a_data = _convert_float(a_data, a.dtype, tl.float16, None).view(np.float16)
        b_data = _convert_float(b_data, b.dtype, tl.float16, None).view(np.float16)
    acc = d.data.copy()                                             # [..., M, N]
    dt = acc.dtype
    for k in range(a_data.shape[-1]):
        acc += a_data[..., :, k:k + 1].astype(dt) * b_data[..., k:k + 1, :].astype(dt)
    return TensorHandle(acc, d.dtype.scalar)


def install() -> None:
    """Replace the interpreter's dot (call before any kernel runs; a no-op without triton)."""
    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError:
        return
    # a renamed hook would leave the interpreter's own dot in place, silently
    assert hasattr(InterpreterBuilder, "create_dot"), "triton's interpreter dot hook moved"
    InterpreterBuilder.create_dot = _dot
