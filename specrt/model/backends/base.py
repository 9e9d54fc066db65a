"""What a backend is: the arithmetic of a decoder layer stack on one kind of device.

A backend is chosen once, when a model is loaded (`specrt.model.backends.select_backend`), and
the model never asks which device it runs on. Every backend computes the same function as the
PyTorch reference (`torch_ref`, the specification); tests run each one against it on the same
inputs, and a backend that promises bitwise verify == decode is tested for that bit for bit.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Callable, Protocol

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

    @functools.cached_property
    def real_index(self) -> torch.Tensor:
        """[N] positions of the real tokens in the flattened [B * T], row after row (computed
        once per pass: the backend packs the ids and the model unpacks the logits by it)."""
        T = self.tokens
        return torch.tensor([b * T + t for b, v in enumerate(self.valid) for t in range(v)],
                            dtype=torch.int64)

    def pack(self, x: torch.Tensor, last_only: bool = False) -> torch.Tensor:
        """x [B, T, ...] -> its real tokens [N, ...] packed row after row, or with last_only
        each row's last real token [B, ...] (meaningless for a row with none)."""
        B, T = x.shape[:2]
        flat = x.reshape(B * T, *x.shape[2:])
        if last_only:
            index = torch.tensor([b * T + max(v, 1) - 1 for b, v in enumerate(self.valid)])
        elif self.all_valid:
            return flat
        else:
            index = self.real_index
        return flat[index.to(x.device)]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """The inverse of `pack`: x [N, ...] -> [B, T, ...], zeros at the padding."""
        B, T = len(self.valid), self.tokens
        if self.all_valid:
            return x.view(B, T, *x.shape[1:])
        out = x.new_zeros(B * T, *x.shape[1:])
        out[self.real_index.to(x.device)] = x
        return out.view(B, T, *x.shape[1:])


def chunks(counts: list[int], most: int) -> list[tuple[int, int, int, int]]:
    """A pass's rows in consecutive groups of whole rows of at most `most` tokens in all (a
    row alone may be up to `most`; most = 0: one group): (first row, end row, first token,
    end token) of each, tokens counted in the packed layout (`Pass.pack`). How a backend
    with batch-invariant passes of limited size splits a larger one, and what the cost model
    prices."""
    out, g0, o0, n = [], 0, 0, 0
    for b, c in enumerate(counts):
        if most and n and n + c > most:
            out.append((g0, b, o0, o0 + n))
            g0, o0, n = b, o0 + n, 0
        n += c
    out.append((g0, len(counts), o0, o0 + n))
    return out


class Backend(Protocol):
    name: str
    batch_invariant_tokens: int   # passes of up to this many tokens per row give each row the
                                  # same bits whatever other rows share them (0: no promise),
                                  # but for a prompt alone: `shared_prompt_tokens`

    @property
    def build_id(self) -> str:
        """Identifies the code that computes (kernel builds included): cost calibrations
        measured under one build are not reused under another."""

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
               quant: str | None = None) -> Linear:
        """Wrap a [out, in] weight (and [out] bias) for this backend's matmuls; quant: store
        it quantized (specrt.model.backends.quantized), None: as it is."""

    def screened_head(self, head: Linear
                      ) -> "Callable[[torch.Tensor], torch.Tensor | None] | None":
        """For a model's output head, what gives each row's argmax without reading all of it
        (`head_screen.ScreenedHead`: h [N, H] -> fp32 logits [N, V], exact at the candidates
        for the argmax and below their max elsewhere, or None where the full head must be
        read), or None where this backend has none (every pass reads the full head)."""

    def hidden(self, model: "Transformer", input_ids: torch.Tensor, cache: "StaticKVCache",
               rows: Pass, last_only: bool = False) -> torch.Tensor:
        """Embedding + layers + final norm of the real tokens of input_ids [B, T] -> [N, H],
        packed row after row (`Pass.pack`; N = sum(rows.valid)), or with last_only each row's
        last real token, [B, H]; writes the real tokens' K/V into `cache` (the caller advances
        its lengths). Padding need not be computed at all."""

    def shared_prompt_tokens(self, model: "Transformer") -> int:
        """The longest prompt of `model` that may share a prefill pass with other prompts and
        keep the bits it gets alone: at most `batch_invariant_tokens`, less where a prompt
        prefilled alone (one row, from position 0) takes a faster path whose bits differ.
        Callers prefill longer prompts on their own."""

    def plan_passes(self, max_rows: int) -> None:
        """The engine's largest decode or verify pass, in rows (B (K + 1)): a backend whose
        batch invariance depends on the row count serves passes up to that size alike."""

    def hidden_static(self, model: "Transformer", input_ids: torch.Tensor,
                      cache: "StaticKVCache") -> torch.Tensor:
        """The CUDA-graph-safe variant of `hidden`: every token is real, positions are read
        from and advanced in the cache's device lengths, nothing syncs with the host."""
