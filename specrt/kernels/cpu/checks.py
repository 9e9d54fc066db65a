"""Argument checks at the boundary of the C++ CPU kernels.

The extensions receive raw data pointers and sizes and cannot see dtypes, shapes, strides or
devices, so a wrong tensor there reads or writes out of bounds instead of failing. The wrappers
(gemv.py, ops.py) check every tensor here first; a bad one raises ValueError naming the
function, the argument, what was expected and what was received.

These run on every call of a decode step, so each check is one short-circuit expression of
attribute reads (~0.5 us a tensor); messages are only built once a check has failed.
"""
from __future__ import annotations

import torch

FLOATS = (torch.bfloat16, torch.float32)
_Tensor = torch.Tensor


def fail(fn: str, name: str, expected: str, got: object) -> ValueError:
    return ValueError(f"{fn}: {name} must be {expected}, got {got}")


def require(available: bool, fn: str, module: str) -> None:
    """A kernel called where it cannot run (no extension, SPECRT_* = 0, or a CPU without the
    ISA: it would die of SIGILL) fails as an error; callers ask the module's AVAILABLE first.
    module: the extension and the instructions it needs here."""
    if not available:
        raise RuntimeError(f"{fn}: {module} is not built, is disabled (SPECRT_* = 0), or this "
                           "CPU lacks those instructions; check the kernel module's AVAILABLE "
                           "first")


# The most threads a kernel takes: its bindings take a C int, and no CPU has more.
MAX_THREADS = 4096


def threads(fn: str, value) -> int:
    """A probe's thread count: None (torch's count) or an int in 1..MAX_THREADS (OpenMP aborts
    the whole process on -1; the bindings refuse what a C int does not hold)."""
    if value is None:
        return torch.get_num_threads()
    return count(fn, "threads", value, MAX_THREADS, " (or None: torch's count)")


def count(fn: str, name: str, value, most: int = 2**31 - 1, also: str = "") -> int:
    """An int in 1..most (a probe's threads, repeats or steps; the bindings take a C int);
    `also`: what else the argument may be, for the message."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(f"{fn}: {name} must be an int in 1..{most}{also}, got {value!r}")
    return value


def floating(fn: str, name: str, t: object, layout: str) -> None:
    """t: a contiguous CPU bf16/fp32 tensor with as many dimensions as `layout` ("[M, H]")."""
    if not (isinstance(t, _Tensor) and t.dtype in FLOATS and t.dim() == layout.count(",") + 1
            and t.is_cpu and t.is_contiguous()):
        _explain(fn, name, t, None, None, layout, "")
        raise fail(fn, name, f"{layout.count(',') + 1}-D {layout}", f"shape {tuple(t.shape)}")


def tensor(fn: str, name: str, t: object, dtype: torch.dtype, shape: tuple[int, ...],
           layout: str, like: str = "") -> None:
    """t: a contiguous CPU tensor of exactly `dtype` (that of argument `like`, if named) and
    `shape` (`layout` names its dims: "[H]")."""
    if not (isinstance(t, _Tensor) and t.dtype == dtype and t.shape == shape and t.is_cpu
            and t.is_contiguous()):
        _explain(fn, name, t, dtype, shape, layout, like)


def row_positions(fn: str, starts: list[int], counts: list[int], s: int) -> None:
    """Row b's counts[b] new tokens go to cache positions starts[b] .. starts[b] + counts[b] - 1
    of a cache of s positions."""
    if len(starts) != len(counts):
        raise fail(fn, "counts", f"one entry per row of starts ({len(starts)})", len(counts))
    for i, (p, n) in enumerate(zip(starts, counts)):
        if p < 0 or n < 0 or p + n > s:
            raise fail(fn, f"starts[{i}], counts[{i}]",
                       f"0 <= starts, 0 <= counts, starts + counts <= S = {s}", (p, n))


def offsets(counts: torch.Tensor) -> torch.Tensor:
    """[B] int64 tokens per row -> [B + 1] where row b's packed tokens start (and end)."""
    out = torch.zeros(counts.shape[0] + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def _explain(fn: str, name: str, t: object, dtype: torch.dtype | None,
             shape: tuple[int, ...] | None, layout: str, like: str) -> None:
    """Raises the ValueError of the first property t lacks (dtype None: bf16 or fp32)."""
    if not isinstance(t, _Tensor):
        raise fail(fn, name, "a torch.Tensor", type(t).__name__)
    if not t.is_cpu:
        raise fail(fn, name, "on the CPU", t.device)
    if dtype is None and t.dtype not in FLOATS:
        raise fail(fn, name, "torch.bfloat16 or torch.float32", t.dtype)
    if dtype is not None and t.dtype != dtype:
        raise fail(fn, name, f"{dtype}" + (f" like {like}" if like else ""), t.dtype)
    if shape is not None and t.shape != shape:
        raise fail(fn, name, f"of shape {layout} = {tuple(shape)}", tuple(t.shape))
    if not t.is_contiguous():
        raise fail(fn, name, "contiguous", f"strides {t.stride()} for shape {tuple(t.shape)}")
