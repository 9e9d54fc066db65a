"""Quantized weights for a draft model: `quantized_linear(format, weight, bias)`.

Formats (QUANT_FORMATS), both weight-only with activations quantized per block of 64 at each
call (the C++ kernels where they run: int8 with AVX-512 VNNI or AVX2, int4 with AVX-512 VNNI;
their PyTorch references elsewhere):
- "int8": per output row (specrt.kernels.cpu.gemv_int8);
- "int4": per output row and group of 64 values, half int8's bytes (specrt.kernels.cpu.gemv_int4;
  input sizes must be multiples of 128).
Any backend can hold such a Linear; it is meant for the draft model, whose numbers only decide
what is proposed (greedy output stays that of the unquantized target; sampling stays exact with
q as the quantized draft computes it).
"""
from __future__ import annotations

import torch

from specrt.errors import ConfigError
from specrt.kernels.cpu import gemv_int4, gemv_int8

# format -> (its kernel module, the multiple every input size must be)
_KERNELS = {"int8": (gemv_int8, gemv_int8.BLOCK), "int4": (gemv_int4, gemv_int4.CHUNK)}
QUANT_FORMATS = tuple(_KERNELS)
QUANT_ACTIVATIONS = (torch.bfloat16, torch.float32)    # what their kernels take as x


class QuantLinear:
    """y = x @ W^T + b with W stored in a quantized format (its kernel module's `quantize`)."""
    kernel = None           # the module: quantize(weight), linear(x, weight, bias, out_dtype)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        self.weight = self.kernel.quantize(weight)
        self.bias = bias

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.kernel.linear(x, self.weight, self.bias, out_dtype)

    @property
    def nbytes(self) -> int:
        b = self.bias
        return self.weight.nbytes + (b.numel() * b.element_size() if b is not None else 0)


class Int8Linear(QuantLinear):
    """int8 weights, per-row scales."""
    kernel = gemv_int8


class Int4Linear(QuantLinear):
    """int4 weights, per-row, per-64-value group scales."""
    kernel = gemv_int4


_LINEARS = {"int8": Int8Linear, "int4": Int4Linear}
# What draft_dtype "auto" picks, in order of preference (benchmarks/RESULTS.md, "Int4 draft").
AUTO_DRAFT_FORMATS = ("int8",)


def quantized_linear(fmt: str, weight: torch.Tensor, bias: torch.Tensor | None = None):
    if fmt not in _KERNELS:
        raise ConfigError(f"unknown weight quantization {fmt!r}; choose one of {QUANT_FORMATS}")
    if weight.dtype not in QUANT_ACTIVATIONS:
        raise ConfigError(f"{fmt} weights run with bfloat16 or float32 activations; this model "
                          f"is in {str(weight.dtype).removeprefix('torch.')}: load it "
                          "unquantized")
    if weight.device.type != "cpu":
        raise ConfigError(f"{fmt} weights run on the CPU only (this model is on "
                          f"{weight.device}); use draft_dtype='auto' (or the model's dtype) "
                          "on CUDA")
    multiple = _KERNELS[fmt][1]
    if weight.shape[1] % multiple:
        others = [f for f, (_, m) in _KERNELS.items() if f != fmt and weight.shape[1] % m == 0]
        raise ConfigError(f"{fmt} weights need input sizes that are multiples of {multiple}; "
                          f"this model has a {weight.shape[1]}-wide projection: load it "
                          f"unquantized{''.join(f' or in {f}' for f in others)}")
    return _LINEARS[fmt](weight, bias)


def auto_draft_format(cfg, device, dtype: torch.dtype) -> str | None:
    """draft_dtype "auto": the first of AUTO_DRAFT_FORMATS that serves this draft here, else
    None (the model's dtype)."""
    return next((f for f in AUTO_DRAFT_FORMATS if quant_serves(f, cfg, device, dtype)), None)


def quant_serves(fmt: str, cfg, device, dtype: torch.dtype) -> bool:
    """Whether `fmt` weights run fast for this model here: on the CPU, with the format's kernel
    available, activations it takes (QUANT_ACTIVATIONS) and every projection's input a
    multiple of what the format needs."""
    kernel, multiple = _KERNELS[fmt]
    widths = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size)
    return (torch.device(device).type == "cpu" and kernel.AVAILABLE
            and dtype in QUANT_ACTIVATIONS and all(w % multiple == 0 for w in widths))
