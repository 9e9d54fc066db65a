"""Triton kernel: the batch-invariant skinny matmul of the CUDA backend's decode and verify passes.

    y[m, n] = sum_k x[m, k] * W[n, k]  (+ bias[n])      x [M, K], W [N, K] (nn.Linear layout)

Products and sums in fp32 (the tensor-core accumulator; fp32 inputs: exact fp32 dots, not TF32),
the bias added in fp32, one rounding to the output dtype: the input dtype, or fp32 (logits come
straight from the accumulator, with no bf16 rounding in between). Reference:
`specrt.kernels.reference_layer.matmul`.

Why not cuBLAS: cuBLAS picks its kernel (tile, split-K, MMA instruction) by M, so the row of a
decode step (M = B) and the same row inside a verify pass (M = B (K + 1)) are summed in different
orders and round differently in bf16, and greedy speculative output drifts from plain greedy
output after a near-tie. Here the reduction order of every output element depends only on the
weight's shape (N, K), never on M or on which other rows share the call:
- one tile shape for every M: BLOCK_M = 16 rows (padding rows masked to zero, never stored), so
  every M runs the same `tl.dot` and the same MMA instruction (mma.sync; wgmma would need 64);
- the k loop walks fixed BLOCK_K blocks in increasing order;
- split-K at fixed block boundaries: split s sums k blocks [s * split_blocks, (s + 1) *
  split_blocks), with split_blocks a function of (N, K) only (`split_blocks_for`: enough
  programs to fill the GPU when N alone gives too few tiles), so a given weight is always split
  the same way. The splits' fp32 partials are merged in split order 0, 1, ... by the last
  program of the tile to finish (an atomic ticket per tile, reset by that program, as in
  `verify_attention`), inside this kernel: one kernel per matmul, CUDA-graph safe.
M may exceed BLOCK_M (more tiles, each the same code); the CUDA backend sends passes of up to
MAX_ROWS rows here by default, up to an engine's largest verify pass (B (K + 1) rows) once the
engine says so, and larger ones (prefills) to cuBLAS.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specrt.kernels.checks import require_runnable
from specrt.kernels.triton.tickets import ticket_buffer, unused_f32

__all__ = ["matmul", "Tile", "tile_for", "DTYPES", "BLOCK_M", "BLOCK_N", "MAX_ROWS",
           "block_k_for", "split_blocks_for", "num_stages_for", "NUM_WARPS"]

# What the launcher can pick; `specrt.kernels.compile_check` compiles exactly these.
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Measured on an H200 (benchmarks.gpu_kernels; RESULTS.md, "The CUDA path on an H200"): of 30
# tiles, 16 x 32 with 4 stages and ~2 programs per SM read a decode step's weights fastest
# (the matmuls of one step at M = 1, last run: 1.5B 1284 us, 0.5B 665; the 32 x 64 tile
# before: 1433, 861; cuBLAS 1326, 673).
BLOCK_M = 16            # rows per tile, for every M (decode B; a verify pass of 17..32 rows: 2)
BLOCK_N = 32            # output columns (weight rows) per tile
NUM_WARPS = 4
MAX_ROWS = 32           # the CUDA backend's default limit (an engine raises it: see above)
TARGET_PROGRAMS = 264   # ~2 programs per SM on an H100/H200 (132 SMs): split-K aims for this
MIN_SPLIT_BLOCKS = 2    # k blocks per split at least


def block_k_for(dtype: torch.dtype) -> int:
    """k per inner step: 128 for 16-bit inputs (one 16-byte load per thread per row chunk);
    32 for fp32, whose exact (FMA) dot holds both operand tiles in registers."""
    return 32 if dtype == torch.float32 else 128


def num_stages_for(dtype: torch.dtype) -> int:
    """Software-pipeline depth of the weight stream (shared memory: stages x (BLOCK_M + BLOCK_N)
    x BLOCK_K x bytes; see `python -m specrt.kernels.compile_check`)."""
    return 2 if dtype == torch.float32 else 4


@dataclass(frozen=True)
class Tile:
    """A launch configuration: the tile, the pipeline and the split-K target. Which one a
    weight gets depends on its dtype only (`tile_for`), never on M, so a row's bits never
    depend on the others; `benchmarks.gpu_kernels` times alternatives with `matmul(tile=)`."""
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    target_programs: int = TARGET_PROGRAMS


def tile_for(dtype: torch.dtype) -> Tile:
    """The launcher's configuration for inputs of `dtype` (`compile_check` compiles these)."""
    return Tile(BLOCK_M, BLOCK_N, block_k_for(dtype), NUM_WARPS, num_stages_for(dtype))


def split_blocks_for(n: int, k: int, dtype: torch.dtype, tile: Tile | None = None) -> int:
    """k blocks per split-K split for a weight [n, k]: a function of the weight's shape only, so
    every call with that weight sums in the same order whatever M is. Splits only when the
    column tiles alone give fewer than the tile's target_programs (o, qkv and down projections:
    N ~ 1-2k; never the output head), and keeps at least MIN_SPLIT_BLOCKS blocks per split."""
    tile = tile or tile_for(dtype)
    k_blocks = max(1, triton.cdiv(k, tile.block_k))
    tiles = triton.cdiv(n, tile.block_n)
    splits = max(1, min(triton.cdiv(tile.target_programs, tiles), k_blocks // MIN_SPLIT_BLOCKS))
    return triton.cdiv(k_blocks, splits)


@triton.jit(do_not_specialize=["M", "split_blocks", "NUM_SPLITS"])
def _matmul_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,  # x [M, K], w [N, K], bias [N], y [M, N]
    part_ptr,  # [NUM_SPLITS, M, N] fp32 partial sums (read only with NUM_SPLITS > 1)
    count_ptr,  # [m_tiles * n_tiles] int32 tickets, zero between launches
    stride_xm, stride_wn, stride_ym,
    M, N, K, split_blocks, NUM_SPLITS,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_IEEE: tl.constexpr,  # fp32 inputs: exact fp32 dots, not TF32
):
    pid_m = tl.program_id(0)  # fastest: the row tiles of one weight tile run side by side (L2)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wn  # [BLOCK_N, 1]

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    first = split * split_blocks
    last = tl.minimum(first + split_blocks, tl.cdiv(K, BLOCK_K))
    for kb in range(first, last):
        ks = kb * BLOCK_K + offs_k
        k_ok = ks < K
        x = tl.load(x_rows + ks[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT_IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)

    out_mask = row_ok[:, None] & col_ok[None, :]
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :]
    if NUM_SPLITS == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=out_mask)
    else:
        part_rows = (split * M + rows).to(tl.int64)[:, None] * N + cols[None, :]
        tl.store(part_ptr + part_rows, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partials are written before the ticket is taken
        ticket_ptr = count_ptr + pid_m * tl.num_programs(1) + pid_n
        ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel")
        if ticket == NUM_SPLITS - 1:  # the last split of this tile merges, in split order
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(0, NUM_SPLITS):
                pr = (s * M + rows).to(tl.int64)[:, None] * N + cols[None, :]
                total += tl.load(part_ptr + pr, mask=out_mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(ticket_ptr, 0)  # ready for the next launch (and graph replay)


def _check(x, weight, bias, out_dtype) -> torch.dtype:
    def bad(what: str) -> ValueError:
        return ValueError(f"matmul: {what}")

    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        raise bad("x and weight must be tensors")
    if x.dim() != 2 or weight.dim() != 2:
        raise bad(f"x must be [M, K] and weight [N, K], got {tuple(x.shape)} and "
                  f"{tuple(weight.shape)}")
    if x.shape[1] != weight.shape[1]:
        raise bad(f"x [M, K] = {tuple(x.shape)} and weight [N, K] = {tuple(weight.shape)} "
                  "differ in K")
    if x.dtype not in DTYPES or weight.dtype != x.dtype:
        raise bad(f"x and weight must share a dtype in {DTYPES}, got {x.dtype}, {weight.dtype}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise bad("x and weight must be contiguous along K (stride 1 in their last dim)")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.dtype != x.dtype
                             or not bias.is_contiguous()):
        raise bad(f"bias must be a contiguous [N] = [{weight.shape[0]}] {x.dtype} tensor, got "
                  f"{tuple(bias.shape)} {bias.dtype}")
    out_dtype = out_dtype or x.dtype
    if out_dtype not in (x.dtype, torch.float32):
        raise bad(f"out_dtype must be {x.dtype} (that of x) or torch.float32, got {out_dtype}")
    devices = {x.device, weight.device} | ({bias.device} if bias is not None else set())
    if len(devices) > 1:
        raise bad(f"inputs on different devices: {sorted(map(str, devices))}")
    require_runnable(x)
    return out_dtype


def matmul(
    x: torch.Tensor,  # [M, K]
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None = None,  # [N]
    out_dtype: torch.dtype | None = None,  # x.dtype (default) or torch.float32
    *,
    split_blocks: int | None = None,  # k blocks per split; None: `split_blocks_for(N, K)`
    tile: Tile | None = None,  # None: `tile_for(x.dtype)`
) -> torch.Tensor:  # [M, N]
    """x @ weight^T (+ bias), each output row's bits independent of M (module docstring).
    Raises ValueError on shapes, dtypes or layouts it does not serve."""
    out_dtype = _check(x, weight, bias, out_dtype)
    M, K = x.shape
    N = weight.shape[0]
    tile = tile or tile_for(x.dtype)
    block_k = tile.block_k
    if split_blocks is None:
        split_blocks = split_blocks_for(N, K, x.dtype, tile)
    if split_blocks < 1:
        raise ValueError(f"matmul: split_blocks must be >= 1, got {split_blocks}")
    y = torch.empty((M, N), device=x.device, dtype=out_dtype)
    if M == 0 or N == 0:
        return y
    num_splits = max(1, triton.cdiv(triton.cdiv(K, block_k), split_blocks))
    m_tiles, n_tiles = triton.cdiv(M, tile.block_m), triton.cdiv(N, tile.block_n)
    if num_splits > 1:
        part = torch.empty((num_splits, M, N), device=x.device, dtype=torch.float32)
        tickets = ticket_buffer(x.device, m_tiles * n_tiles)
    else:
        part, tickets = unused_f32(x.device), ticket_buffer(x.device, 1)   # never read
    _matmul_kernel[(m_tiles, n_tiles, num_splits)](
        x, weight, bias if bias is not None else weight, y, part, tickets,
        x.stride(0), weight.stride(0), y.stride(0),
        M, N, K, split_blocks, num_splits,
        HAS_BIAS=bias is not None, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=block_k,
        DOT_IEEE=x.dtype == torch.float32, num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    return y
