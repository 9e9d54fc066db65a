"""The CPU-native backend: decode and verify passes through specrt's C++ kernels.

A decode step of a small model on the CPU is ~85% weight streaming and ~15% small ops. The
matmuls go through `specrt.kernels.cpu.gemv` (the weight streamed once per call for 1..32
rows), or where the CPU has AMX-BF16 through `specrt.kernels.cpu.gemv_amx` (a bf16 model's
weights packed for the tiles, every pass of any length there: `AmxLinear`), and the rest of
each layer through `specrt.kernels.cpu.ops`: one call for the residual
add + RMSNorm, one for RoPE + KV-cache write + attention, one for SwiGLU; in bf16 the whole
layer loop runs as one C++ call on those same kernels (`specrt.kernels.cpu.layers`, whose
specification is `CpuNative.layers_per_op`). Both compute every
token on its own in a fixed order, so a verify pass of K + 1 tokens gives the bits of the
K + 1 decode steps it replaces, in bf16 too, whatever other rows share the batch. Only real
tokens are computed: a batch's rows are packed, so a row with fewer drafts (or none) costs
only its own tokens. Passes of more than MAX_ROWS tokens per row (prefills) take the
reference, except a quantized model's prompts of up to QUANT_PROMPT_ROWS tokens; so does a bf16
prompt prefilled alone from `gemv.PROMPT_LIBRARY_ROWS` tokens (9 where specrt sees AMX-BF16)
when the model is not packed for AMX tiles, whose products then take the library GEMM: the
engine shares no prompt that long (`shared_prompt_tokens`).
"""
from __future__ import annotations

import dataclasses
import weakref

import torch

from specrt.kernels.cpu import gemv, gemv_amx, huge_pages, ops
from specrt.kernels.cpu import layers as layer_stack
from specrt.kernels.cpu.extension import switched_off
from specrt.model.backends import head_screen
from specrt.model.backends.base import Pass, chunks
from specrt.model.backends.quantized import Int4Linear, Int8Linear, QuantLinear
from specrt.model.backends.torch_ref import TorchLinear, TorchReference

DTYPES = (torch.bfloat16, torch.float32)


def available(dtype: torch.dtype) -> bool:
    """The C++ layer ops are built, this CPU runs them, and they serve this dtype."""
    return ops.AVAILABLE and dtype in DTYPES


# A quantized model's prompt of up to this many tokens a row also runs here: its products are
# specrt's int8 / int4 kernels on either path, and the reference's PyTorch glue around them (SDPA,
# norms, rotary, ~30 dispatches a layer) cost more than this loop's. The int8 0.5B draft's prompt
# of 50 tokens on a Xeon: 0.60-0.65 target decode steps through the reference, 0.49-0.52 here;
# 137 tokens: 1.50-1.54 and 1.27-1.36; 300: about even (benchmarks/RESULTS.md, "AMX for the int8
# draft's prompt"; int4 by the same reasoning, not timed). A bf16 prompt keeps the reference,
# whose products are oneDNN's.
QUANT_PROMPT_ROWS = 256

# From how many ids a head is screened for greedy passes (`screened_head`): a vocabulary of
# tens of thousands (151,936 for Qwen2) saves milliseconds a step; a tiny test model's few
# hundred would save microseconds (the tests set it to 0).
SCREEN_MIN_ROWS = 16384


class GemvLinear(TorchLinear):
    """y = x @ W^T + b through the C++ skinny-matmul kernel where it is faster (decode and
    verify row counts), `F.linear` elsewhere (`gemv.linear` decides per call)."""

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return gemv.linear(x, self.weight, self.bias, out_dtype)


class AmxLinear:
    """y = x @ W^T + b on AMX-BF16 tiles (`gemv_amx.linear`), W packed once (`gemv_amx.pack`),
    for every pass whatever its rows: its bits are not the AVX-512 kernels', so a model's
    bf16 projections all take one or the other (`CpuNative(amx=...)`)."""

    def __init__(self, packed: torch.Tensor, n: int, k: int, bias: torch.Tensor | None = None):
        self.weight = packed               # [N * K] in the kernel's layout
        self.n, self.k = n, k
        self.bias = bias                   # [N]

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return gemv_amx.linear(x, self.weight, self.n, self.k, self.bias, out_dtype)

    @property
    def nbytes(self) -> int:
        b = self.bias
        return self.weight.nbytes + (b.numel() * b.element_size() if b is not None else 0)


class CpuNative(TorchReference):
    name = "cpu_native"
    batch_invariant_tokens = ops.MAX_ROWS    # every row computed on its own, in chunks
    fused_loop = True                        # bf16 layers through specrt._cpu_layers when built

    def __init__(self, huge: bool | None = None, amx: bool | None = None):
        """huge: keep the projections' weights in transparent huge pages (None: where the
        kernel gives them and SPECRT_HUGE_PAGES is not 0; `specrt.kernels.cpu.huge_pages`).
        amx: multiply bf16 weights on AMX-BF16 tiles, packed for them (None: where
        `gemv_amx.AVAILABLE`); False keeps the AVX-512 kernels (other bits)."""
        self._stacks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> Stack
        in_huge_pages = huge_pages.enabled() if huge is None else huge
        self._arena = huge_pages.Arena() if in_huge_pages else None
        self.amx = gemv_amx.AVAILABLE if amx is None else bool(amx) and gemv_amx.AVAILABLE

    @property
    def build_id(self) -> str:
        return (f"{super().build_id}|gemv-{gemv.build_id()}|ops-{ops.build_id()}"
                f"|layers-{layer_stack.build_id() if self.fused_loop else 'off'}"
                f"|pages-{'huge' if self._arena is not None else '4k'}"    # steps cost less in huge
                f"|bf16-{'amx' if self.amx else 'avx'}")

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
               quant: str | None = None):
        if quant is not None:
            lin = super().linear(weight, bias, quant)
            w = lin.weight                     # Int8Weight / Int4Weight: data and scales
            lin.weight = dataclasses.replace(w, **{f.name: self._place(getattr(w, f.name))
                                                   for f in dataclasses.fields(w)
                                                   if isinstance(getattr(w, f.name), torch.Tensor)})
            return lin
        if self.amx and gemv_amx.serves(weight):
            return AmxLinear(self._place(gemv_amx.pack(weight)), *weight.shape, bias)
        return GemvLinear(self._place(weight), bias)

    def screened_head(self, head) -> head_screen.ScreenedHead | None:
        """An int8 copy of a large bf16 or fp32 head for greedy passes (`head_screen`), where
        its full product is the C++ kernel's (not AMX tiles, whose rows a gathered product
        would not reproduce) and SPECRT_HEAD_SCREEN is not 0."""
        if not (isinstance(head, GemvLinear) and head.weight.shape[0] >= SCREEN_MIN_ROWS
                and head_screen.serves(head.weight, head.bias)
                and not switched_off(head_screen.ENV_VAR)):
            return None
        return head_screen.ScreenedHead(head.weight, self._place)

    def _place(self, t: torch.Tensor) -> torch.Tensor:
        """Where a weight every decode step streams is kept: a copy in huge pages, or t."""
        return self._arena.copy(t) if self._arena is not None else t

    def shared_prompt_tokens(self, model) -> int:
        """Prompts that a pass alone would give the library GEMM (`_lone_prompt`) are not
        shared: their bits would be the kernels' in a shared pass."""
        library_from = self._prompt_library_rows(model)
        if library_from is None:
            return self.batch_invariant_tokens
        return min(self.batch_invariant_tokens, library_from - 1)

    def hidden(self, model, input_ids: torch.Tensor, cache, rows: Pass,
               last_only: bool = False) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self._most_rows(model) or self._lone_prompt(model, rows):
            return super().hidden(model, input_ids, cache, rows, last_only)
        # Only real tokens are computed, packed row after row (a row without drafts in a
        # verify pass costs one token, not K + 1). Passes of more than MAX_ROWS tokens run in
        # chunks of whole rows: a row's bits never depend on which rows share its pass.
        ids = rows.pack(input_ids)                                           # [N]
        stack = self._stack(model)
        h = torch.cat([self._pass(model, stack, ids[o0:o1], cache.rows(g0, g1),
                                  rows.starts[g0:g1], rows.valid[g0:g1])
                       for g0, g1, o0, o1 in chunks(rows.valid, ops.MAX_ROWS)])  # [N, H]
        if last_only:
            ends = torch.tensor(rows.valid).cumsum(0)                        # [B]
            h = h[(ends - 1).clamp(min=0)]                                   # [B, H]
        return h

    def hidden_static(self, model, input_ids: torch.Tensor, cache) -> torch.Tensor:
        """The static pass (an engine built with graphs; on the CPU nothing is captured): the
        same packed C++ pass as `hidden`, its positions read from the cache's lengths, so a
        static engine gives the eager engine's bits (the reference's static body is plain
        PyTorch, whose bf16 rounding differs). Returns [B, T, H]; advances cache.lengths."""
        B, T = input_ids.shape
        rows = Pass(T, cache.lengths[:B].tolist(), [T] * B)
        h = self.hidden(model, input_ids, cache, rows)                       # [B * T, H]
        cache.lengths[:B] += T
        return h.reshape(B, T, -1)

    def _pass(self, model, stack, ids: torch.Tensor, cache, starts: list[int],
              counts: list[int]) -> torch.Tensor:
        x = model.embed[ids]                                                 # [N, H], a copy
        if stack is not None:
            return stack.run(x, cache, starts, counts)
        return self.layers_per_op(model, x, cache, starts, counts)

    @staticmethod
    def _quantized(model) -> bool:
        return isinstance(model.layers[0].qkv, QuantLinear)

    def _most_rows(self, model) -> int:
        """The most new tokens a row a pass of `model` may have on this path."""
        return QUANT_PROMPT_ROWS if self._quantized(model) else ops.MAX_ROWS

    @staticmethod
    def _prompt_library_rows(model) -> int | None:
        """From how many tokens a prompt of `model` prefilled alone takes the library GEMM:
        `gemv.PROMPT_LIBRARY_ROWS` for a bf16 model on the AVX-512 kernels; None for one
        packed for AMX tiles, quantized or fp32 (no such path)."""
        if model.dtype == torch.bfloat16 and type(model.layers[0].qkv) is GemvLinear:
            return gemv.PROMPT_LIBRARY_ROWS
        return None

    def _lone_prompt(self, model, rows: Pass) -> bool:
        """A prompt prefilled alone (one row, from position 0) long enough for the library
        GEMM (`_prompt_library_rows`), which the reference's loop then multiplies (`product`)."""
        library_from = self._prompt_library_rows(model)
        return (library_from is not None and len(rows.valid) == 1 and rows.starts[0] == 0
                and rows.valid[0] >= library_from)

    def product(self, linear, x: torch.Tensor) -> torch.Tensor:
        """The reference's loop runs here for prompts only (`hidden`): from PROMPT_LIBRARY_ROWS
        rows their bf16 products take the library GEMM, where `gemv.linear` would keep up to
        MAX_ROWS on the kernels."""
        if type(linear) is GemvLinear and x.numel() // x.shape[-1] >= gemv.PROMPT_LIBRARY_ROWS:
            return TorchLinear.__call__(linear, x)
        return linear(x)

    def _stack(self, model) -> layer_stack.Stack | None:
        """The model's C++ layer loop (built once), or None: the per-op loop then."""
        if not self.fused_loop:
            return None
        if model not in self._stacks:
            self._stacks[model] = layer_stack.Stack.build(model, _kernel_weights)
        return self._stacks[model]

    def layers_per_op(self, model, x: torch.Tensor, cache, starts: list[int],
                      counts: list[int]) -> torch.Tensor:
        """The layers and final norm of packed tokens x [N, H] (embedded; row b's counts[b]
        tokens at positions starts[b] + t), one C++ call per norm, projection, attention block
        and SwiGLU: the specification of the fused loop (specrt.kernels.cpu.layers), and the
        path of what it does not serve. The residual stream x is updated in place; returns the
        final-normed hidden states [N, H]."""
        cfg = model.cfg
        eps = cfg.rms_norm_eps
        starts_t = torch.tensor(starts, dtype=torch.int64)                   # [B]
        counts_t = torch.tensor(counts, dtype=torch.int64)                   # [B]
        scale = cfg.head_dim ** -0.5
        h = ops.rms_norm(x, model.layers[0].input_norm, eps)
        for i, layer in enumerate(model.layers):
            k_cache, v_cache = cache.layer(i)                                # [Bmax, Hkv, S, D]
            attn = ops.rope_attention(layer.qkv(h), k_cache, v_cache, model.cos, model.sin,
                                      starts_t, counts_t, cfg.num_heads, scale)
            h = ops.add_rms_norm(x, layer.o(attn), layer.post_norm, eps)
            act = ops.silu_mul(layer.gate_up(h))                             # [N, I]
            after = model.layers[i + 1].input_norm if i + 1 < len(model.layers) else model.norm
            h = ops.add_rms_norm(x, layer.down(act), after, eps)
        return h


def _kernel_weights(linear):
    """How a projection is stored for the kernels: (format "bf16" | "int8" | "int4", weight,
    scales or None, bias), or None for a form the fused loop does not multiply."""
    if type(linear) is GemvLinear:
        return "bf16", linear.weight, None, linear.bias
    if type(linear) is AmxLinear:
        return "bf16_amx", linear.weight, None, linear.bias
    if type(linear) is Int8Linear:
        return "int8", linear.weight.data, linear.weight.scale, linear.bias
    if type(linear) is Int4Linear:
        return "int4", linear.weight.data, linear.weight.scale, linear.bias
    return None
