"""Facts about the machine a benchmark ran on, two probes of how busy it is, and where torch
work beside an `LLM` runs (`on_own_thread`).

The machine is often shared, so every result carries the CPU, thread counts, load average and
(on CPU) a contention probe: readers must be able to judge the noise. The facts are a plain
dict because they go verbatim into the JSON line and RESULTS.md. This module measures and
returns; it never prints (report.print_header renders these facts).
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import threading
import time
from typing import Callable, TypeVar

from benchmarks.harness.timing import measure, median

T = TypeVar("T")


def cpu_model() -> str:
    """The CPU's name, as `auto`'s calibration keys it."""
    from specrt.spec.calibration import cpu_name
    return cpu_name()


def load_average() -> tuple[float, float, float]:
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return (float("nan"),) * 3


def machine_info(threads: int, device: str = "cpu") -> dict:
    """Date, CPU, versions, threads and load; the GPU name on CUDA, else a contention probe.
    Scripts add "load_average_end" when they finish."""
    import torch

    info = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host_nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "threads_asked": threads,
        "python": platform.python_version(),
        "load_average": list(load_average()),
        "device": device,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    else:
        info["contention_probe"] = contention_probe(threads)
    return info


def on_own_thread(fn: Callable[[], T], name: str = "torch-work") -> T:
    """fn() on a thread of its own that ends with it (torch's thread count as the caller's),
    its result returned and its exception raised here. For torch work beside an `LLM`: a
    parallel op run by a thread that stays alive (the main thread) leaves an OpenMP team there,
    and with two teams on the machine's cores libgomp stops spinning, which slowed specrt's
    decoding in the same process by 11-21% (benchmarks/RESULTS.md, "Kernel threads"). A team
    dies with its thread."""
    import torch

    threads, box = torch.get_num_threads(), {}

    def run() -> None:
        torch.set_num_threads(threads)
        try:
            box["result"] = fn()
        except BaseException as e:         # raised again on the caller's thread
            box["error"] = e

    worker = threading.Thread(target=run, name=name)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def contention_probe(threads: int) -> dict:
    """How long one small parallel op (x.mul_ over 1 MB) takes with `threads` threads vs one.

    On a quiet machine the two are within a few x of each other (tens of us). When another job
    holds a core, every OpenMP parallel region waits for a descheduled worker (milliseconds),
    and a 2-thread decode step with hundreds of such regions slows down tens of times:
    the load average alone does not show how bad that is, this does.
    """
    import torch

    def probe(n: int) -> float:                    # median us per op
        torch.set_num_threads(n)
        x = torch.ones(1 << 18)                    # 2^18 fp32 = 1 MB
        ts = []
        for _ in range(120):
            t0 = time.perf_counter()
            x.mul_(1.0)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts[20:]) * 1e6

    one, many = on_own_thread(lambda: (probe(1), probe(threads)), "contention-probe")
    ratio = many / one if one > 0 else float("nan")
    return {"us_1_thread": round(one, 1), f"us_{threads}_threads": round(many, 1),
            "ratio": round(ratio, 1), "contended": bool(threads > 1 and many > 500.0)}


def read_bandwidth(threads: int, nbytes: int = 1 << 30, repeats: int = 7) -> dict:
    """Measured read bandwidth of this machine: x.sum() over an fp32 tensor of `nbytes`
    (default 1 GiB, far larger than any cache), with the current torch thread count, on a
    thread of its own (`on_own_thread`)."""
    import torch

    def timed() -> list[float]:
        x = torch.ones(nbytes // 4, dtype=torch.float32)    # ones: every page really allocated
        return measure(lambda: x.sum(), repeats, warmup=2)

    times = on_own_thread(timed, "read-bandwidth")
    return {"gb_per_s": nbytes / median(times) / 1e9, "best_gb_per_s": nbytes / min(times) / 1e9,
            "bytes": nbytes, "repeats": repeats, "method": "fp32 tensor.sum() over 1 GiB",
            "threads": threads}
