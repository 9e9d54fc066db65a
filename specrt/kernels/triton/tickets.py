"""Zeroed int32 ticket counters for kernels whose splits are merged by the last program to
finish (`verify_attention`, `matmul`).

Each split of a tile takes a ticket with an atomic add; the program that draws the last one
merges every split's partial in split order and puts the counter back to 0, so the buffer is
zero between launches (and between CUDA-graph replays) and launches on one stream may share it.
A buffer is never freed: a captured graph keeps the address it was captured with.
"""
from __future__ import annotations

import torch

__all__ = ["ticket_buffer"]

_tickets: dict = {}         # device -> the newest zeroed ticket buffer
_retired: list = []         # older ones, kept alive: a captured graph may still use them


def ticket_buffer(device: torch.device, n: int) -> torch.Tensor:  # [>= n] int32 zeros
    buf = _tickets.get(device)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _retired.append(buf)
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _tickets[device] = buf
    return buf
