"""What a round costs on this machine: c_verify(T) for the target and c_draft for one draft step.

Measured once per (model, dtype, device, threads) by a short calibration — a few forwards on a
small private cache, so the serving caches are untouched — and kept for the process. The
adaptive planner scales these by online ratios (measured / calibrated), so a machine that gets
busier or quieter moves every estimate together.
"""
from __future__ import annotations

import dataclasses
import statistics
import threading
import time

import torch

from specrt.model import Transformer

_PREFIX = 32          # calibration context length
_REPEATS = 3
_cache: dict[tuple, list[float]] = {}
_lock = threading.Lock()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_seconds(model: Transformer, max_t: int) -> list[float]:
    """Median seconds of one forward of T new tokens, T = 1..max_t, after a _PREFIX prefix.
    Element 0 is T = 1."""
    key = (model.source, str(model.dtype), str(model.device), torch.get_num_threads(), max_t)
    with _lock:
        if key in _cache:
            return _cache[key]
    cache = model.new_cache(1, _PREFIX + max_t)
    ids = torch.randint(0, min(model.cfg.vocab_size, 1000), (1, _PREFIX + max_t),
                        generator=torch.Generator().manual_seed(0)).to(model.device)
    model.forward(ids[:, :_PREFIX], cache)
    out = []
    for t in range(1, max_t + 1):
        times = []
        for rep in range(_REPEATS + 1):
            cache.truncate([_PREFIX])
            _sync(model.device)
            t0 = time.perf_counter()
            model.forward(ids[:, _PREFIX:_PREFIX + t], cache)
            _sync(model.device)
            if rep:                                   # the first is a warm-up
                times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    # Latency cannot fall as T grows; smooth away timing noise so the planner sees a monotone
    # curve.
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1])
    with _lock:
        _cache[key] = out
    return out


@dataclasses.dataclass
class CostModel:
    verify: list[float]           # [K_max + 1] seconds of a target pass over T = index + 1 tokens
    draft_step: float             # seconds of one draft-model decode step (0 if no draft model)

    @classmethod
    def calibrate(cls, target: Transformer, draft: Transformer | None, max_k: int) -> "CostModel":
        verify = forward_seconds(target, max_k + 1)
        draft_step = forward_seconds(draft, 1)[0] if draft is not None else 0.0
        return cls(verify=verify, draft_step=draft_step)

    def verify_seconds(self, t: int) -> float:
        return self.verify[min(t, len(self.verify)) - 1]
