"""The decoder layer loop of a bf16 CPU decode or verify pass in one C++ call (specrt._cpu_layers).

The specification is the per-op loop of `specrt.model.backends.cpu_native`
(`CpuNative.layers_per_op`): the same kernels (specrt._gemv, specrt._cpu_ops) called in the same
order, so the two give the same bits; here the 9 calls per layer run from C++ with reused
scratch buffers, without a Python call, a tensor check and an allocation each (~15% of a 0.5B
draft step, ~3% of a 1.5B target step; benchmarks/RESULTS.md).

A `Stack` is built once per model: every weight is checked then (dtype, shape, contiguity) and
the model keeps them alive; each `run` checks the pass's own tensors and bounds. Models it does
not serve (fp32, weights in another form) keep the per-op loop (`Stack.build` returns None).
"""
from __future__ import annotations

import torch

from specrt.kernels.cpu import checks, extension
from specrt.kernels.cpu import gemv, gemv_amx, gemv_int4, gemv_int8

_layers, AVAILABLE = extension.load("specrt._cpu_layers", "SPECRT_CPU_LAYERS",
                                    "the C++ layer loop", "the per-op layer loop")


def build_id() -> str:
    return _layers.build_id() if AVAILABLE else "library"


class Stack:
    """A model's decoder layers, ready for `run` (build with `Stack.build`)."""

    def __init__(self, model, handle):
        self.model = model                  # keeps every weight the handle points at alive
        self._handle = handle
        cfg = model.cfg
        self._shape = (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)

    @classmethod
    def build(cls, model, weights_of) -> "Stack | None":
        """The C++ stack of `model`, or None where it does not serve it (not built, not bf16,
        a projection not a bf16 (row-major or packed for AMX), int8 or int4 kernel weight).
        weights_of(linear) -> (format, weight, scales or None, bias or None): how the backend
        stores a projection (None: not as a kernel weight)."""
        if not AVAILABLE or model.dtype != torch.bfloat16 or model.device.type != "cpu":
            return None
        cfg = model.cfg
        h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
        layers = []
        for layer in model.layers:
            shapes = ((layer.qkv, q + 2 * kv, h), (layer.o, h, q),
                      (layer.gate_up, 2 * inter, h), (layer.down, h, inter))
            linears = [_linear(weights_of(lin), n, k) for lin, n, k in shapes]
            norms = [_vector(v, h) for v in (layer.input_norm, layer.post_norm)]
            if None in linears or None in norms:
                return None
            layers.append((norms[0], linears[0], linears[1], norms[1], linears[2], linears[3]))
        final = _vector(model.norm, h)
        d = cfg.head_dim
        cos, sin = model.cos, model.sin
        if final is None or not all(t.dtype == torch.bfloat16 and t.is_contiguous()
                                    and t.dim() == 2 and t.shape[1] == d and t.shape[0] >= 1
                                    for t in (cos, sin)):
            return None
        handle = _layers.Stack(layers, final, cos.data_ptr(), sin.data_ptr(), h, cfg.num_heads,
                               cfg.num_kv_heads, d, inter, cos.shape[0], cfg.rms_norm_eps,
                               d ** -0.5)
        return cls(model, handle)

    def run(self, x: torch.Tensor, cache, starts: list[int], counts: list[int]) -> torch.Tensor:
        """x [M, H] bf16, the embedded packed tokens (row b's counts[b] tokens at positions
        starts[b] + t; M = sum(counts)), updated in place as the residual stream; writes the
        tokens' K/V into `cache` (a cache or a `rows` view of B rows). Returns the final-normed
        hidden states [M, H]."""
        fn = "layer stack"
        L, hkv, d = self._shape
        m = sum(counts)
        checks.tensor(fn, "x", x, torch.bfloat16, (m, self.model.cfg.hidden_size), "[M, H]")
        k, v = cache.k, cache.v                                         # [L, B, Hkv, S, D]
        b, s = len(starts), cache.capacity                             # positions allocated
        for name, t in (("k_cache", k), ("v_cache", v)):
            if not (t.dtype == torch.bfloat16 and t.shape == (L, b, hkv, s, d) and t.is_cpu
                    and t.stride()[1:] == (hkv * s * d, s * d, d, 1)):
                raise checks.fail(fn, name, f"[L, B, Hkv, S, D] = {(L, b, hkv, s, d)} bf16, "
                                  "rows of contiguous [Hkv, S, D]",
                                  f"{t.dtype} {tuple(t.shape)} strides {t.stride()}")
        if k.stride() != v.stride():
            raise checks.fail(fn, "v_cache", "laid out like k_cache", v.stride())
        checks.row_positions(fn, starts, counts, s)
        starts_t = torch.tensor(starts, dtype=torch.int64)                 # [B]
        offsets = checks.offsets(torch.tensor(counts, dtype=torch.int64))  # [B + 1]
        out = torch.empty_like(x)
        self._handle.run(x.data_ptr(), out.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), s,
                         starts_t.data_ptr(), offsets.data_ptr(), b, torch.get_num_threads())
        return out


def _vector(t: torch.Tensor, n: int) -> int | None:
    ok = (isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 and t.shape == (n,)
          and t.is_cpu and t.is_contiguous())
    return t.data_ptr() if ok else None


# format -> (its code in layers.h, weight dtype, weight shape, scale shape, kernel usable) for
# a projection [n, k]
_FORMATS = {
    "bf16": lambda n, k: (0, torch.bfloat16, (n, k), None, gemv.AVAILABLE),
    "bf16_amx": lambda n, k: (3, torch.bfloat16, (n * k,), None,
                              gemv_amx.AVAILABLE and gemv_amx.fits(n, k)),
    "int8": lambda n, k: (1, torch.uint8, gemv_int8.data_shape(n, k), (n,),
                          gemv_int8.AVAILABLE and k % gemv_int8.BLOCK == 0),
    "int4": lambda n, k: (2, torch.uint8, (n, k // 2), (n, k // gemv_int4.GROUP),
                          gemv_int4.AVAILABLE and k % gemv_int4.CHUNK == 0),
}


def _linear(stored, n: int, k: int) -> tuple | None:
    """(weight, scale, bias, N, K, format code) of a projection [n, k] stored as (format,
    weight, scales or None, bias) -- "bf16": weight [n, k] bf16, no scales; "bf16_amx": bf16
    [n * k] packed for AMX tiles (gemv_amx.pack), no scales; "int8": uint8
    [n, k] in the kernel's layout (gemv_int8.PACK_ROWS), row scales [n] fp32; "int4": uint8
    [n, k / 2], group scales [n, k / 64] fp32 -- or None."""
    if stored is None or stored[0] not in _FORMATS:
        return None
    fmt, w, scale, bias = stored
    code, dtype, shape, scale_shape, usable = _FORMATS[fmt](n, k)
    b = 0 if bias is None else _vector(bias, n)
    if b is None or not (usable and isinstance(w, torch.Tensor) and w.dtype == dtype
                         and w.shape == shape and w.is_cpu and w.is_contiguous()):
        return None
    if scale_shape is None:
        return (w.data_ptr(), 0, b, n, k, code) if scale is None else None
    if (isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and scale.is_cpu
            and scale.shape == scale_shape and scale.is_contiguous()):
        return (w.data_ptr(), scale.data_ptr(), b, n, k, code)
    return None
