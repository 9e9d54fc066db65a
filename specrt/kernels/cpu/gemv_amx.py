"""bf16 y = x @ W^T + b on AMX-BF16 tiles (csrc/cpu/gemv_bf16_amx.cpp), W packed once.

Where the CPU has AMX-BF16 (and SPECRT_AMX is not 0), the CPU backend packs every bf16
projection whose sizes allow it (`serves`) and runs every pass of the model here: decode steps,
verify passes and prompts (in chunks of 32 rows, each streaming the weight once). A tile dot
product takes a 16 x 32 block of x against 32 x 16 weights per instruction, so a pass of up to
32 rows costs about what a decode step costs, where the AVX-512 kernels' time grows with every
row (benchmarks/RESULTS.md, "AMX-BF16 for every bf16 pass"). Each output sums its 32-wide
blocks in order whatever M is, so a verify pass has the bits of its decode steps; those bits
differ from the AVX-512 kernels' (another order), which is why a model's passes never mix the
two.

The specification is `reference_linear` (the unpacked weight through `F.linear` in fp32): the
kernel's sums run in another order, so they agree to rounding, and bit for bit with themselves
at every M.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specrt.kernels.cpu import checks, gemv

GROUP = 16       # weight rows a tile, and a unit's half
BLOCK = 32       # k values a tile
# The kernel runs here: built, AVX-512 and AMX-BF16 usable (cpu_amx_bf16() in cpu_features.h).
AVAILABLE = gemv.AVAILABLE and bool(gemv._gemv.bf16_amx_supported())


def fits(n: int, k: int) -> bool:
    """Whether the kernel's layout holds a weight [n, k]: whole groups of rows, whole blocks."""
    return n > 0 and k > 0 and n % GROUP == 0 and k % BLOCK == 0


def serves(weight: torch.Tensor) -> bool:
    """Whether a weight [N, K] can be packed and multiplied here."""
    return (AVAILABLE and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and fits(*weight.shape))


def _units(n: int) -> list[tuple[int, int, int]]:
    """(first row, rows, groups a unit) of each run of units: the pairs of groups, then a last
    lone group."""
    pairs = n // (2 * GROUP) * 2 * GROUP
    return [(0, pairs, 2)] * bool(pairs) + [(pairs, n - pairs, 1)] * (n > pairs)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] bf16 -> the kernel's layout, flat [N * K] (gemv_bf16_amx.cpp): units of
    two 16-row groups, each unit's 32-wide blocks in order, a block's groups side by side, a
    group's block as tile[p][n][e] = W[n][32 b + 2 p + e]."""
    if not (isinstance(weight, torch.Tensor) and weight.dim() == 2 and fits(*weight.shape)):
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"pack: weight must be [N, K] with N a multiple of {GROUP} and K of "
                         f"{BLOCK} (check fits() first), got {got}")
    n, k = weight.shape
    parts = []
    for r0, rows, g in _units(n):
        w = weight[r0:r0 + rows].reshape(rows // (g * GROUP), g, GROUP, k // BLOCK, BLOCK // 2, 2)
        parts.append(w.permute(0, 3, 1, 4, 2, 5).reshape(-1))          # [u, b, g, p, n, e]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """`pack`'s inverse: [N * K] -> the weight [N, K]."""
    out, at = [], 0
    for _, rows, g in _units(n):
        u = rows // (g * GROUP)
        w = packed[at:at + rows * k].view(u, k // BLOCK, g, BLOCK // 2, GROUP, 2)
        out.append(w.permute(0, 2, 4, 1, 3, 5).reshape(rows, k))        # [u, g, n, b, p, e]
        at += rows * k
    return torch.cat(out)


def reference_linear(x: torch.Tensor, packed: torch.Tensor, n: int, k: int,
                     bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The specification: x @ W^T + b in fp32, rounded to out_dtype (default x's)."""
    y = F.linear(x.float(), unpack(packed, n, k).float(),
                 bias.float() if bias is not None else None)
    return y.to(out_dtype or x.dtype)


def linear(x: torch.Tensor, packed: torch.Tensor, n: int, k: int,
           bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [..., K] bf16 @ the packed weight (+ bias [N]) -> [..., N] in out_dtype (bf16, or fp32
    for logits), any number of rows; ValueError for operands it does not take."""
    fn = "gemv_amx.linear"
    checks.require(AVAILABLE, fn, "specrt._gemv with AMX-BF16")
    if not fits(n, k):
        raise checks.fail(fn, "n, k", f"positive multiples of {GROUP} and {BLOCK}", (n, k))
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or not x.is_cpu:
        raise checks.fail(fn, "x", "a bf16 CPU tensor [..., K]",
                          getattr(x, "dtype", type(x).__name__))
    if x.dim() < 1 or x.shape[-1] != k:
        raise checks.fail(fn, "x", f"[..., K] with K = {k}", f"shape {tuple(x.shape)}")
    checks.tensor(fn, "packed", packed, torch.bfloat16, (n * k,), "[N * K]")
    if bias is not None:
        checks.tensor(fn, "bias", bias, torch.bfloat16, (n,), "[N]")
    out_dtype = out_dtype or torch.bfloat16
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise checks.fail(fn, "out_dtype", "torch.bfloat16 or torch.float32", out_dtype)
    rows = x.numel() // k
    out = torch.empty(*x.shape[:-1], n, dtype=out_dtype)
    if rows == 0:
        return out
    x2 = x.reshape(rows, k).contiguous()                                 # [M, K]
    gemv._gemv.gemv_bf16_amx(x2.data_ptr(), packed.data_ptr(),
                             bias.data_ptr() if bias is not None else 0, out.data_ptr(),
                             out_dtype == torch.float32, rows, n, k, torch.get_num_threads())
    return out
