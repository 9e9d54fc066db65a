"""Zeroed int32 ticket counters for kernels whose splits are merged by the last program to
finish (`verify_attention`, `matmul`).

Each split of a tile takes a ticket with an atomic add; the program that draws the last one
merges every split's partial in split order and puts the counter back to 0, so the buffer is
zero between launches (and between CUDA-graph replays) and launches on one stream may share it.
A buffer is never freed: a captured graph keeps the address it was captured with.
"""
from __future__ import annotations

import torch

__all__ = ["ticket_buffer", "unused_f32"]

_tickets: dict = {}         # device -> the newest zeroed ticket buffer
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


def ticket_buffer(device: torch.device, n: int) -> torch.Tensor:  # [>= n] int32 zeros
    buf = _tickets.get(device)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _retired.append(buf)
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _tickets[device] = buf
    return buf
