"""Zeroed int32 ticket counters for kernels whose splits are merged by the last program to
finish (`verify_attention`, `matmul`).

Each split of a tile takes a ticket with an atomic add; the program that draws the last one
merges every split's partial in split order and puts the counter back to 0, so the buffer is
zero between launches (and between CUDA-graph replays) and launches that run one after another
may share it; launches that may overlap must not (a stray ticket makes a tile merge before its
splits are written, and every later launch after it). So a buffer serves one CUDA stream
(launches on a stream run in order): eager launches take their stream's, and captured graphs
one of their own, allocated before the first capture (`prepare_capture`) and shared by every
graph, since graphs replay one at a time on the engine's stream. Another engine's warm-up on a
side stream (a draft model loaded for a request, on its own thread) then never shares a buffer
with the graphs replaying meanwhile. Off CUDA (the interpreter) one buffer per device.
A buffer is never freed: a captured graph keeps the address it was captured with.
"""
from __future__ import annotations

import threading

import torch

__all__ = ["ticket_buffer", "unused_f32", "prepare_capture"]

GRAPHS = "graphs"           # the key of the captured graphs' buffer
_tickets: dict = {}         # (device, stream handle | GRAPHS) or device -> the newest buffer
_lock = threading.Lock()    # two engines' threads may capture (and grow a buffer) at once
_retired: list = []         # older ones, kept alive: a captured graph may still use them
_unused: dict = {}          # device -> unused_f32's buffer


def unused_f32(device: torch.device) -> torch.Tensor:  # [1] fp32
    """The partial-sum arguments of a launch with one split, never read or written. They are
    typed as the kernels are compiled (fp32 partials, int32 tickets: `ticket_buffer`), because
    the split branch is compiled whatever the launch takes: an atomic on a bf16 or fp16
    pointer does not compile (triton 3.6)."""
    buf = _unused.get(device)
    if buf is None:
        buf = _unused[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return buf


def _key(device: torch.device):
    if device.type != "cuda":
        return device
    if torch.cuda.is_current_stream_capturing():
        return (device, GRAPHS)
    return (device, torch.cuda.current_stream(device).cuda_stream)


def _sized(key, device: torch.device, n: int) -> torch.Tensor:
    with _lock:
        buf = _tickets.get(key)
        if buf is None or buf.numel() < n:
            if buf is not None:
                _retired.append(buf)
            buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
            _tickets[key] = buf
        return buf


def ticket_buffer(device: torch.device, n: int) -> torch.Tensor:  # [>= n] int32 zeros
    """The zeroed tickets of a launch on the current stream (module docstring)."""
    return _sized(_key(device), device, n)


def prepare_capture(device: torch.device, warmed_on: "torch.cuda.Stream") -> None:
    """Before a capture whose warm-up ran on `warmed_on`: allocate the graphs' buffer, outside
    the capture, as large as the warm-up needed (a capture must allocate nothing that outlives
    it)."""
    warm = _tickets.get((device, warmed_on.cuda_stream))
    _sized((device, GRAPHS), device, warm.numel() if warm is not None else 0)
