"""The compute floor of a pass: how fast this CPU multiplies.

A forward over T new tokens does 2 T floating-point operations per weight (a multiply-add
each; more for attention, `pass_flops`), so no pass on the bf16 kernels' instructions can beat
(its flops) / (the rate those instructions issue at). `peak_flops` measures that rate with the
C++ probe (csrc/cpu/dot_peak.cpp: AVX-512 BF16's vdpbf16ps, or at the AVX2 level fp32 FMA, on
register operands only, independent chains on every thread, nothing else); a decode step is
held by the memory-read floor instead (`specrt.kernels.cpu.bandwidth`). Together they are a
pass's floor, max(read, compute): a verify pass wide enough to be held by the second costs
about as much however fast memory runs. Where the bf16 passes run on AMX tiles (`amx`), the
tiles multiply faster than this probe, and it is no floor of theirs.
`dot_peak_reference` is what the probe returns by definition (its test).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from specrt.kernels.cpu import checks
from specrt.kernels.cpu.gemv import AVAILABLE, _gemv   # the probe lives in specrt._gemv

if TYPE_CHECKING:      # pass_flops reads a config's shapes; the kernels import no model code
    from specrt.model.config import ModelConfig

STEPS = 2_000_000       # a probe run's steps per thread: ~0.01-0.1 s on an AVX-512 core


def method() -> str:
    if not AVAILABLE:
        return "none (the C++ extension is not built here, or the CPU has no AVX-512 / AVX2)"
    return ("AVX-512 BF16 dot products (vdpbf16ps, csrc/cpu/dot_peak.cpp)"
            if _gemv.cpu_level() == "avx512" else "AVX2 fp32 FMA (csrc/cpu/dot_peak.cpp)")


def amx() -> bool:
    """Whether the bf16 passes may run on AMX tiles here, which this probe does not time."""
    return AVAILABLE and bool(_gemv.amx_bf16())


def dot_peak_reference(steps: int, scale: float, threads: int) -> float:
    """What the probe returns: every multiply-add of 1 by `scale` (scale rounded to bf16 at the
    AVX-512 level, as the instruction reads it), summed; exactly so for a scale whose sums
    fp32 holds exactly (1, 0.375), as the probe's fp32 accumulators round the others."""
    if _gemv.cpu_level() == "avx512":
        scale = float(torch.tensor(scale).to(torch.bfloat16))
    return steps * threads * _gemv.dot_peak_flops_per_step() / 2 * scale


def peak_flops(threads: int | None = None, repeats: int = 5, steps: int = STEPS
               ) -> float | None:
    """Floating-point operations per second the bf16 kernels' instructions issue at on
    `threads` threads (default: torch's count): the best of `repeats` probe runs (a busy
    machine only slows a run); None without the probe."""
    threads = checks.threads("peak_flops", threads)
    repeats = checks.count("peak_flops", "repeats", repeats)
    steps = checks.count("peak_flops", "steps", steps)
    if not AVAILABLE:
        return None
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        _gemv.dot_peak(steps, 0.0, threads)
        best = min(best, time.perf_counter() - t0)
    return steps * threads * _gemv.dot_peak_flops_per_step() / best


def pass_flops(cfg: ModelConfig, tokens: int, prefix: int = 0, logits: int | None = None
               ) -> float:
    """Floating-point operations of a forward over `tokens` new tokens after `prefix` cached
    ones: every projection's multiply-adds per token, the attention's over the positions each
    token sees (scores and values, each head), and the output head over `logits` positions
    (default: every new token's, as a verify pass scores them)."""
    h, heads, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * cfg.intermediate_size
    seen = tokens * prefix + tokens * (tokens + 1) / 2        # positions the new tokens attend
    attention = 2 * heads * d * seen                          # q.k and p.v per position, per head
    logits = tokens if logits is None else logits
    return 2.0 * (cfg.num_layers * (tokens * per_layer + attention)
                  + logits * h * cfg.vocab_size)
