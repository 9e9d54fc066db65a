"""Timing: one call, repeated calls, the median. All durations are in seconds.

CUDA work is timed with CUDA events (the host returns before the kernels finish); everything
else with perf_counter. This module does not print, choose repeat counts or know what is being
timed: callers pass a closure.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Sequence


def _on_cuda(device) -> bool:
    import torch

    return str(device).startswith("cuda") and torch.cuda.is_available()


def sync(device) -> None:
    """Wait for queued device work (a no-op off CUDA)."""
    if _on_cuda(device):
        import torch

        torch.cuda.synchronize()


def time_once(fn: Callable[[], object], device="cpu") -> float:
    """Seconds of one call of fn: CUDA events on CUDA, perf_counter elsewhere."""
    if _on_cuda(device):
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3       # elapsed_time is in ms
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(fn: Callable[[], object], repeats: int, warmup: int = 1, device="cpu",
            setup: Callable[[], object] | None = None) -> list[float]:
    """Seconds of `repeats` timed calls of fn after `warmup` untimed ones; `setup` (untimed)
    runs before every call, e.g. to roll a cache back."""
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        if setup:
            setup()
        sync(device)
        out.append(time_once(fn, device))
    return out


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
                device="cpu", setup: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """Seconds of `repeats` calls of each of fns, taken in turns: every repeat calls each once,
    the order reversed on every other repeat, so drift in the machine's speed hits all alike.
    `warmup` untimed rounds first; `setup` (untimed) runs before every call."""
    out = {name: [] for name in fns}
    order = list(fns)
    for r in range(warmup + repeats):
        for name in (order if r % 2 == 0 else order[::-1]):
            if setup:
                setup()
            sync(device)
            seconds = time_once(fns[name], device)
            if r >= warmup:
                out[name].append(seconds)
    return out


def copy_bandwidth(device, nbytes: int, repeats: int, warmup: int = 2,
                   setup: Callable[[], object] | None = None) -> float:
    """GB/s of a device copy `dst.copy_(src)` of nbytes, counting bytes read + written
    (median of `repeats`)."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = median(measure(lambda: dst.copy_(src), repeats, warmup, device, setup))
    del src, dst
    return 2 * nbytes / seconds / 1e9


def decode_step_seconds(model, steps: int = 10, position: int = 60) -> float:
    """Seconds of one decode step (one row) of a specrt Transformer at `position`: a fresh
    cache, an untimed prompt pass of `position` tokens, then `steps` timed one-token passes
    (the cache grows by one each; their mean)."""
    import torch

    cache = model.new_cache(1, position + steps + 64)
    model.forward(torch.arange(100, 100 + position, device=model.device)[None], cache)
    token = torch.tensor([[42]], device=model.device)
    sync(model.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        model.forward(token, cache)
    sync(model.device)
    return (time.perf_counter() - t0) / steps


def decode_phase(res) -> tuple[int, float]:
    """(tokens, seconds) of a specrt result's decode phase: the tokens after the first (the
    prompt's pass made it) and the seconds after that pass."""
    return len(res.token_ids) - 1, res.stats["seconds"] - res.stats["prefill_seconds"]


def decode_speed(res) -> float:
    """Decode-only tokens/s of a specrt result (`decode_phase`), NaN for an empty phase."""
    tokens, seconds = decode_phase(res)
    return tokens / seconds if seconds > 0 else float("nan")


def median(xs: Sequence[float]) -> float:
    """The median, NaN for an empty sequence (a table shows it as '-')."""
    return statistics.median(xs) if xs else float("nan")
