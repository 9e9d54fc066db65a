"""The memory-read floor of a decode step: how fast this machine reads a model's weights.

A decode step must read every weight once, so no decode can beat (weight bytes) / (the time
to just read them). `read_seconds` measures that time with the fastest reader specrt has: the
C++ probe (csrc/cpu/stream_read.cpp: AVX-512 or AVX2 loads over each tensor, split across the
threads, nothing else) run over the model's own weight tensors, or, without the extension, PyTorch's
`sum` (slower: its numbers are a lower bound of the floor, said so in `method`).
"""
from __future__ import annotations

import time

import torch

from specrt.kernels.cpu import checks
from specrt.kernels.cpu.gemv import AVAILABLE, _gemv   # the probe lives in specrt._gemv


def weight_tensors(model) -> list[torch.Tensor]:
    """The tensors a decode step of `model` (a specrt Transformer) reads: every projection's
    weight (data and scales when quantized) and bias, the output head and the norms."""
    from specrt.kernels.cpu.gemv_int4 import Int4Weight
    from specrt.kernels.cpu.gemv_int8 import Int8Weight

    out = [model.norm]
    for lin in [model.lm_head] + [x for layer in model.layers
                                  for x in (layer.qkv, layer.o, layer.gate_up, layer.down)]:
        w = lin.weight
        out += [w.data, w.scale] if isinstance(w, (Int8Weight, Int4Weight)) else [w]
        if lin.bias is not None:
            out.append(lin.bias)
    out += [t for layer in model.layers for t in (layer.input_norm, layer.post_norm)]
    return out


def method() -> str:
    return ("AVX-512 / AVX2 streaming read (csrc/cpu/stream_read.cpp)" if AVAILABLE
            else "torch.sum per tensor (no C++ probe: a lower bound of the floor)")


def read_seconds(tensors: list[torch.Tensor], threads: int | None = None) -> float:
    """Wall seconds to read every byte of `tensors` once (CPU, contiguous: a strided view's
    numel * element_size bytes are not all its own, so it is refused)."""
    if not (isinstance(tensors, (list, tuple))
            and all(isinstance(t, torch.Tensor) for t in tensors)):
        raise ValueError("read_seconds: tensors must be a list of tensors, got "
                         f"a {type(tensors).__name__}")
    bad = [tuple(t.shape) for t in tensors if not (t.is_cpu and t.is_contiguous())]
    if bad:
        raise ValueError(f"read_seconds: tensors must be contiguous CPU tensors, got shape "
                         f"{bad[0]} strided or off the CPU")
    threads = checks.threads("read_seconds", threads)
    t0 = time.perf_counter()
    for t in tensors:
        if AVAILABLE:
            _gemv.stream_read(t.data_ptr(), t.numel() * t.element_size(), threads)
        else:
            t.sum()
    return time.perf_counter() - t0
