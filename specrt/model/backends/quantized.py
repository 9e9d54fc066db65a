"""Quantized weights for a draft model: `quantized_linear(format, weight, bias)`.

Formats (QUANT_FORMATS): "int8", weight-only per output row, with activations quantized per
block of 64 at each call (specrt.kernels.cpu.gemv_int8: the AVX-512 VNNI kernel where it runs,
its PyTorch reference elsewhere). Any backend can hold such a Linear; it is meant for the draft
model, whose numbers only decide what is proposed (greedy output stays that of the unquantized
target; sampling stays exact with q as the quantized draft computes it).
"""
from __future__ import annotations

import torch

from specrt.errors import ConfigError
from specrt.kernels.cpu import gemv_int8

QUANT_FORMATS = ("int8",)


class Int8Linear:
    """y = x @ W^T + b with W stored as int8 (per-row scales)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = gemv_int8.quantize(weight)
        self.bias = bias

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return gemv_int8.linear(x, self.weight, self.bias, out_dtype)

    @property
    def nbytes(self) -> int:
        b = self.bias
        return self.weight.nbytes + (b.numel() * b.element_size() if b is not None else 0)


def quantized_linear(fmt: str, weight: torch.Tensor, bias: torch.Tensor | None = None):
    if fmt != "int8":
        raise ConfigError(f"unknown weight quantization {fmt!r}; choose one of {QUANT_FORMATS}")
    if weight.device.type != "cpu":
        raise ConfigError(f"int8 weights run on the CPU only (this model is on {weight.device}); "
                          "use draft_dtype=None on CUDA")
    if weight.shape[1] % gemv_int8.BLOCK:
        raise ConfigError(f"int8 weights need input sizes that are multiples of "
                          f"{gemv_int8.BLOCK}; this model has a {weight.shape[1]}-wide "
                          "projection: load it unquantized")
    return Int8Linear(weight, bias)


def int8_serves(cfg, device) -> bool:
    """Whether int8 weights run fast for this model here: on the CPU, with the int8 kernel
    available and every projection's input a multiple of its 64-value blocks."""
    widths = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size)
    return (torch.device(device).type == "cpu" and gemv_int8.AVAILABLE
            and all(w % gemv_int8.BLOCK == 0 for w in widths))
