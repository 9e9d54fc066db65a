"""Weights in transparent huge pages: a decode step's stream of weights through 2 MiB pages.

A CPU decode step reads every weight once, gigabytes through 4 KiB pages by default: a new
page, and a TLB miss, every 4 KiB of the stream. Linux hands out 2 MiB pages to a private
anonymous mapping advised MADV_HUGEPAGE (`/sys/kernel/mm/transparent_hugepage/enabled` is
"always" or "madvise"; the common default "madvise" needs the advice). `Arena.copy` puts a
tensor in such a mapping; the CPU backend copies every projection's weight there at load.
Measured on the development machine (Zen 3, 2 cores; `python -m benchmarks.huge_pages`, each
model loaded both ways in one process, steps interleaved): a 1.5B bf16 decode step 1.20x and
1.09x faster, the 0.5B int8 draft's 1.01x and 1.10x, in two runs (benchmarks/RESULTS.md,
"Weights in huge pages").

Where the kernel does not honour the advice the mapping is an ordinary one: the same bytes, no
faster, no slower. `SPECRT_HUGE_PAGES=0` keeps weights where the loader put them.
"""
from __future__ import annotations

import mmap

import torch

from specrt.kernels.cpu.extension import switched_off

ENV_VAR = "SPECRT_HUGE_PAGES"
PAGE = 2 << 20           # the huge page size on x86-64 and most arm64 kernels
CHUNK = 128 << 20        # tensors up to CHUNK / 2 share mappings of this size; larger get their own
ALIGN = 64               # every tensor starts on a cache line
MIN_BYTES = 1 << 20      # smaller tensors (norms, biases) stay where they are
_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode() -> str | None:
    """The kernel's transparent-huge-page mode ("always", "madvise", "never"), or None where
    it does not say (not Linux, no THP)."""
    try:
        with open(_SETTING) as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def enabled() -> bool:
    """Weights go to huge pages: the kernel gives them (THP "always" or "madvise"), Python can
    ask for them (mmap.MADV_HUGEPAGE), and SPECRT_HUGE_PAGES does not switch them off
    (`extension.switched_off`: 0, false, off, no)."""
    if switched_off(ENV_VAR):
        return False
    return hasattr(mmap, "MADV_HUGEPAGE") and thp_mode() in ("always", "madvise")


class Arena:
    """Bump allocator over private anonymous mappings advised MADV_HUGEPAGE. A tensor it hands
    out keeps its mapping alive (torch.frombuffer holds a reference), so a mapping is unmapped
    when the last tensor in it is freed."""

    def __init__(self):
        self._buf: torch.Tensor | None = None      # [CHUNK] uint8, the mapping being filled
        self._used = 0

    def _mapping(self, nbytes: int) -> torch.Tensor:
        size = -(-nbytes // PAGE) * PAGE
        # private: a shared anonymous mapping (mmap's default) got no huge pages
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):        # no THP here: an ordinary mapping, no slower
            pass
        return torch.frombuffer(m, dtype=torch.uint8)                     # [size]

    def _bytes(self, nbytes: int) -> torch.Tensor:
        if nbytes > CHUNK // 2:                     # a big tensor gets a mapping of its own
            return self._mapping(nbytes)[:nbytes]
        start = -(-self._used // ALIGN) * ALIGN
        if self._buf is None or start + nbytes > self._buf.numel():
            self._buf, start = self._mapping(CHUNK), 0
        self._used = start + nbytes
        return self._buf[start:start + nbytes]

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of CPU tensor t in huge pages (t itself if it is small, or not a
        plain CPU tensor)."""
        if t.device.type != "cpu" or t.is_sparse or t.nbytes < MIN_BYTES:
            return t
        out = self._bytes(t.nbytes).view(t.dtype).view(t.shape)
        out.copy_(t)
        return out
