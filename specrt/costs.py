"""What a round costs on this machine: c_verify(T) for the target and c_draft for one draft step.

Measured once per (model, dtype, device, threads, CPU, kernel build) by a short calibration — a few forwards
on a small private cache, so the serving caches are untouched — and kept in memory and on disk
($SPECRT_CACHE/calibration.json, written atomically). The
adaptive planner scales these by online ratios (measured / calibrated), so a machine that gets
busier or quieter moves every estimate together.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import threading
import time

import torch

from specrt.kernels.cpu import gemv as cpu_gemv, ops as cpu_ops
from specrt.model import Transformer

_PREFIX = 32          # calibration context length
_REPEATS = 3
_cache: dict[tuple, list[float]] = {}
_lock = threading.Lock()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_seconds(model: Transformer, max_t: int) -> list[float]:
    """Seconds of one forward of T new tokens after a _PREFIX-token prefix, T = 1..max_t
    (element 0 is T = 1). T = 1, 2, the middle and max_t are timed (median of _REPEATS after a
    warm-up) and the rest interpolated: a memory-bound forward grows close to linearly in T,
    except for the step from 1 to 2 rows, where CPU matmuls switch kernels. Cached in memory and in $SPECRT_CACHE/calibration.json."""
    key = "|".join(map(str, (model.source, model.dtype, model.device, torch.get_num_threads(),
                             max_t, _cpu_name(), _kernel_builds())))
    with _lock:
        if key not in _cache:
            _cache.update(_load_disk())
        if key in _cache:
            return _cache[key]
    cache = model.new_cache(1, _PREFIX + max_t)
    ids = torch.randint(0, min(model.cfg.vocab_size, 1000), (1, _PREFIX + max_t),
                        generator=torch.Generator().manual_seed(0)).to(model.device)
    model.forward(ids[:, :_PREFIX], cache)
    measured = {}
    for t in sorted({1, min(2, max_t), (max_t + 1) // 2, max_t}):
        times = []
        for rep in range(_REPEATS + 1):
            cache.truncate([_PREFIX])
            _sync(model.device)
            t0 = time.perf_counter()
            model.forward(ids[:, _PREFIX:_PREFIX + t], cache)
            _sync(model.device)
            if rep:                                   # the first is a warm-up
                times.append(time.perf_counter() - t0)
        measured[t] = statistics.median(times)
    points = sorted(measured)
    out = []
    for t in range(1, max_t + 1):
        lo = max(p for p in points if p <= t)
        hi = min(p for p in points if p >= t)
        w = 0.0 if hi == lo else (t - lo) / (hi - lo)
        out.append((1 - w) * measured[lo] + w * measured[hi])
    # Latency cannot fall as T grows; keep the curve monotone despite timing noise.
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1])
    with _lock:
        _cache[key] = out
        _save_disk(_cache)
    return out


@functools.lru_cache(maxsize=None)
def _kernel_builds() -> str:
    """Which builds of the CPU kernels serve (each extension's hash of its sources and flags,
    "library" where PyTorch serves): timings measured with one build are not reused with
    another."""
    return f"{cpu_gemv.build_id()}|{cpu_ops.build_id()}"


def _cpu_name() -> str:
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _disk_path():
    import os
    from pathlib import Path

    if os.environ.get("SPECRT_CALIBRATION"):          # tests point this at a temp file
        return Path(os.environ["SPECRT_CALIBRATION"])
    root = Path(os.environ.get("SPECRT_CACHE", Path.home() / ".cache" / "specrt"))
    return root / "calibration.json"


def _load_disk() -> dict:
    import json

    try:
        raw = json.loads(_disk_path().read_text())
        return {k: v for k, v in raw.items() if isinstance(v, list)}
    except (OSError, ValueError):
        return {}


def _save_disk(entries: dict) -> None:
    """Best effort, atomic: a calibration that cannot be saved is simply redone next time."""
    import json
    import os
    import tempfile

    path = _disk_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-calibration-")
        with os.fdopen(fd, "w") as f:
            json.dump(entries, f)
        os.replace(tmp, path)
    except OSError:
        pass


@dataclasses.dataclass
class CostModel:
    verify: list[float]           # [K_max + 1] seconds of a target pass over T = index + 1 tokens
    draft: list[float]            # [K_max + 1] the same for the draft model ([] if none)

    @classmethod
    def calibrate(cls, target: Transformer, draft: Transformer | None, max_k: int) -> "CostModel":
        verify = forward_seconds(target, max_k + 1)
        return cls(verify=verify,
                   draft=forward_seconds(draft, max_k + 1) if draft is not None else [])

    @property
    def draft_step(self) -> float:
        """Seconds of one draft-model decode step (0 without a draft model)."""
        return self.draft[0] if self.draft else 0.0

    def verify_seconds(self, t: int) -> float:
        return _at(self.verify, t)

    def draft_seconds(self, t: int) -> float:
        """One draft forward over t tokens (its catch-up on committed tokens it has not seen)."""
        return _at(self.draft, t) if self.draft else 0.0


def _at(curve: list[float], t: int) -> float:
    """curve[t - 1], extended linearly past its end (a forward's cost grows ~linearly in T)."""
    if t <= len(curve):
        return curve[t - 1]
    slope = (curve[-1] - curve[0]) / (len(curve) - 1) if len(curve) > 1 else curve[0]
    return curve[-1] + slope * (t - len(curve))
