"""What a backend is: the arithmetic of a decoder layer stack on one kind of device.

A backend is chosen once, when a model is loaded (`specrt.model.backends.select_backend`), and
the model never asks which device it runs on. Every backend computes the same function as the
PyTorch reference (`torch_ref`, the specification); tests run each one against it on the same
inputs, and a backend that promises bitwise verify == decode is tested for that bit for bit.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from specrt.model.kv_cache import StaticKVCache
    from specrt.model.transformer import Transformer


class Linear(Protocol):
    """y = x @ W^T + b, with the weight in whatever layout the backend streams fastest."""

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        ...

    @property
    def nbytes(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class Pass:
    """One forward pass's rows: row b's T new tokens sit at positions starts[b] + t, and the
    first valid[b] of them are real (the rest are right-padding whose K/V are not kept)."""

    tokens: int           # T, new tokens per row (real or padding)
    starts: list[int]     # [B] cache length of each row before the pass
    valid: list[int]      # [B] real tokens per row, 0..T

    @property
    def all_valid(self) -> bool:
        return all(v == self.tokens for v in self.valid)


class Backend(Protocol):
    name: str
    batch_invariant_tokens: int   # passes of up to this many tokens per row give each row the
                                  # same bits whatever other rows share them (0: no promise)

    @property
    def build_id(self) -> str:
        """Identifies the code that computes (kernel builds included): cost calibrations
        measured under one build are not reused under another."""

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
               quant: str | None = None) -> Linear:
        """Wrap a [out, in] weight (and [out] bias) for this backend's matmuls; quant: store
        it quantized (specrt.model.backends.quantized), None: as it is."""

    def hidden(self, model: "Transformer", input_ids: torch.Tensor, cache: "StaticKVCache",
               rows: Pass, last_only: bool = False) -> torch.Tensor:
        """Embedding + layers + final norm of input_ids [B, T] -> [B, T, H] (last_only: each
        row's last valid token, [B, 1, H]); writes the new tokens' K/V into `cache` (the
        caller advances its lengths)."""

    def hidden_static(self, model: "Transformer", input_ids: torch.Tensor,
                      cache: "StaticKVCache") -> torch.Tensor:
        """The CUDA-graph-safe variant of `hidden`: every token is real, positions are read
        from and advanced in the cache's device lengths, nothing syncs with the host."""
