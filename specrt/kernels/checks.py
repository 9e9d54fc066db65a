"""The kernels' checks of their inputs (the Triton launchers' and the PyTorch reference's),
made before any pointer reaches a kernel.

A failed check is a ValueError naming what is wrong: an `assert` would vanish under
`python -O` and let a bad shape or stride reach the GPU as an out-of-bounds read. A CPU tensor
given to a Triton kernel needs the Triton interpreter, on before the first kernel module is
imported (see specrt.kernels.dispatch); without it, a RuntimeError.
"""
from __future__ import annotations

import os

import torch


def require(ok: bool, message: str) -> None:
    """ValueError(message) unless ok."""
    if not ok:
        raise ValueError(message)


def require_runnable(t: torch.Tensor) -> None:
    """A CUDA tensor, or a CPU one under the Triton interpreter."""
    if not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("Triton kernels on CPU tensors need TRITON_INTERPRET=1 set before "
                           "specrt.kernels is imported")
