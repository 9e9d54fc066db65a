"""The CUDA backend: decode and verify passes through fused Triton layer kernels.

A decode (T = 1) or verify (T = K + 1 <= MAX_KERNEL_T) pass runs each decoder layer as 8
kernels (counted per layer):

  1. QKV projection, without its bias                                    (`matmul`)
  2. bias + RoPE + KV-cache write + attention, flash-decoding splits
     merged inside                                      (`rope_verify_attention`, Triton)
  3. o projection                                                        (`matmul`)
  4. residual add + post-attention RMSNorm, both outputs (`add_rms_norm`, Triton)
  5. gate/up projection                                                  (`matmul`)
  6. SiLU(gate) * up                                        (`silu_mul`, Triton)
  7. down projection                                                     (`matmul`)
  8. residual add + the next layer's input RMSNorm (the final norm after the last layer)
                                                         (`add_rms_norm`, Triton)

plus, once per pass, the embedding gather and the first input RMSNorm (and the lm_head matmul
in the Transformer). Every matmul of a decode or verify pass (up to MAX_KERNEL_T tokens a row)
with at most `kernel_rows` rows in all (B (K + 1); MAX_MATMUL_ROWS, raised by an engine to its
largest verify pass through `plan_passes`) goes through `linear_rows`: the batch-invariant
Triton `matmul` (fixed tiles, k order and split-K per weight; logits in fp32 straight from its
accumulator); prefills of more than MAX_MATMUL_ROWS rows take cuBLAS. Prefills of more than
MAX_KERNEL_T tokens and head sizes other than 64/128 take the reference layer loop (SDPA). The
kernels come through `specrt.kernels`' dispatcher: Triton on CUDA tensors, the references
elsewhere (SPECRT_KERNELS=triton runs the kernels under the interpreter on CPU tensors, which is
how the tests check this wiring). `hidden_static` is the body that `specrt.model.graphs`
captures in CUDA graphs.

Batch invariance: every kernel above gives a token the same bits whatever other tokens share
its pass, so a verify pass reproduces the decode steps it replaces, in bf16 too: every pass of
an engine's rounds has at most `kernel_rows` rows (cuBLAS beyond, for prefills only; at a fixed
32 rows, B = 2 and K = 16 or B = 4 and K >= 8 took cuBLAS and lost the decode steps' bits).
A pass with padding (rows with fewer drafts, or none) is computed whole, padding included: a
real token never attends to the padding after it, and the padding's K/V land past the row's
length, where stale slots are masked and later overwritten (as in the graph path). That
promise is per pass, not per row count, which `batch_invariant_tokens` cannot express, so it
stays 0 (prefills also take SDPA).
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from specrt.kernels import add_rms_norm, matmul, rope_verify_attention, silu_mul
from specrt.model.backends.base import Pass
from specrt.model.backends.torch_ref import TorchLinear, TorchReference

MAX_KERNEL_T = 17              # the largest pass the fused path serves (K_max + 1)
KERNEL_HEAD_DIMS = (64, 128)   # = specrt.kernels.triton.verify_attention.HEAD_DIMS
KERNELS_PER_LAYER = 8          # the list above (tests/test_cuda_backend.py counts them)
MAX_MATMUL_ROWS = 32           # = specrt.kernels.triton.matmul.MAX_ROWS: the default limit


def kernel_serves(t: int, head_dim: int) -> bool:
    """The fused path serves head sizes 64 and 128 (the Qwen2.5 family; the sizes the compile
    check compiles) for up to MAX_KERNEL_T new tokens per row."""
    return t <= MAX_KERNEL_T and head_dim in KERNEL_HEAD_DIMS


def linear_rows(x: torch.Tensor,  # [..., K]
                weight: torch.Tensor,  # [N, K]
                bias: torch.Tensor | None = None,  # [N]
                out_dtype: torch.dtype | None = None,
                max_rows: int = MAX_MATMUL_ROWS) -> torch.Tensor:  # [..., N]
    """x @ weight^T + bias: through the batch-invariant `matmul` when x has at most max_rows
    rows (a row's bits then never depend on the others; fp32 results are its accumulator),
    through cuBLAS (`F.linear`, fp32 by upcast) otherwise."""
    K = x.shape[-1]
    rows = x.numel() // K if K else 0
    if 0 < rows <= max_rows:
        x2 = x.reshape(rows, K)                                                # [M, K]
        y = matmul(x2 if x2.stride(-1) == 1 else x2.contiguous(), weight, bias, out_dtype)
        return y.view(*x.shape[:-1], weight.shape[0])
    y = F.linear(x, weight, bias)
    return y if out_dtype is None or y.dtype == out_dtype else y.to(out_dtype)


class InvariantLinear(TorchLinear):
    """A projection or output head of the CUDA backend (see `linear_rows`), up to its
    backend's `kernel_rows`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, backend: "Cuda"):
        super().__init__(weight, bias)
        self.backend = backend

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return linear_rows(x, self.weight, self.bias, out_dtype, self.backend.rows_limit())


class Cuda(TorchReference):
    name = "cuda"

    def __init__(self):
        self._zero_bias: dict = {}   # (width, dtype, device) -> zeros, for models without one
        self.kernel_rows = MAX_MATMUL_ROWS   # decode/verify passes up to this many rows: the
                                             # Triton matmul
        self._pass = threading.local()       # the limit of the pass this thread is running

    def plan_passes(self, max_rows: int) -> None:
        self.kernel_rows = max(self.kernel_rows, max_rows)

    def rows_limit(self) -> int:
        """The Triton matmul's row limit in the pass this thread runs (its projections and the
        logits after it): `kernel_rows` in a decode or verify pass, MAX_MATMUL_ROWS in a prefill
        (cuBLAS beyond: its bits need not match any other pass's). Set by `_begin_pass`."""
        return getattr(self._pass, "limit", MAX_MATMUL_ROWS)

    def _begin_pass(self, tokens_per_row: int) -> None:
        self._pass.limit = self.kernel_rows if tokens_per_row <= MAX_KERNEL_T \
            else MAX_MATMUL_ROWS

    @property
    def build_id(self) -> str:
        # Cost calibrations timed when the projections were cuBLAS are not this backend's.
        return f"{super().build_id}|cuda-bi-matmul"

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
               quant: str | None = None):
        if quant is not None:
            return super().linear(weight, bias, quant)
        return InvariantLinear(weight, bias, self)

    def hidden(self, model, input_ids: torch.Tensor, cache, rows: Pass,
               last_only: bool = False) -> torch.Tensor:
        B, T = input_ids.shape
        self._begin_pass(T)
        # Padding is computed like real tokens (module docstring), where the cache has room
        # (an engine's always has: StaticKVCache's slack).
        if not (kernel_serves(T, model.cfg.head_dim)
                and max(rows.starts) + T <= cache.capacity):
            return super().hidden(model, input_ids, cache, rows, last_only)
        ends = [s + T for s in rows.starts]
        lens = torch.tensor(ends, dtype=torch.int32, device=model.device)       # [B]
        h = self.fused_layers(model, input_ids, cache, lens)                   # [B, T, H]
        return rows.pack(h, last_only)                                         # [N | B, H]

    def hidden_static(self, model, input_ids: torch.Tensor, cache) -> torch.Tensor:
        B, T = input_ids.shape
        self._begin_pass(T)
        if not kernel_serves(T, model.cfg.head_dim):
            return super().hidden_static(model, input_ids, cache)
        lens = (cache.lengths[:B] + T).to(torch.int32)                         # [B]
        h = self.fused_layers(model, input_ids, cache, lens)
        cache.lengths[:B] += T
        return h

    def fused_layers(self, model, input_ids: torch.Tensor, cache,
                     lens: torch.Tensor) -> torch.Tensor:
        """Embedding, layers and final norm -> [B, T, H]; row b's tokens sit at
        lens[b] - T .. lens[b] - 1 and their K/V are written there. `x` is the residual
        stream [B * T, H], `h` the normed input of the next matmul."""
        cfg = model.cfg
        B, T = input_ids.shape
        eps = cfg.rms_norm_eps
        x = model.embed[input_ids.reshape(-1)]                                 # [B * T, H]
        h, _ = add_rms_norm(x, None, model.layers[0].input_norm, eps)
        for i, layer in enumerate(model.layers):
            k_cache, v_cache = cache.layer(i)                                  # [Bmax, Hkv, S, D]
            qkv = linear_rows(h, layer.qkv.weight, max_rows=self.rows_limit())
            qkv = qkv.view(B, T, -1)                                           # [B, T, q + 2 kv]
            attn = rope_verify_attention(qkv, self._bias(layer.qkv), model.cos, model.sin,
                                         k_cache[:B], v_cache[:B], lens, cfg.num_heads)
            attn = attn.reshape(B * T, cfg.q_size)      # a copy only if not contiguous (the
                                                        # reference kernel's output)
            h, x = add_rms_norm(x, layer.o(attn), layer.post_norm, eps)
            act = silu_mul(layer.gate_up(h))                                   # [B * T, I]
            after = model.layers[i + 1].input_norm if i + 1 < len(model.layers) else model.norm
            h, x = add_rms_norm(x, layer.down(act), after, eps)
        return h.view(B, T, -1)

    def _bias(self, linear) -> torch.Tensor:  # [out]
        if linear.bias is not None:
            return linear.bias
        w = linear.weight
        key = (w.shape[0], w.dtype, w.device)
        if key not in self._zero_bias:
            self._zero_bias[key] = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
        return self._zero_bias[key]
