"""A static, preallocated KV cache with per-row lengths and O(1) rollback.

Allocated once per model for (max_batch_size, max_seq_len) and never reallocated, zeroed or
copied while decoding. A row's valid prefix is `lengths[row]`; everything at or past it is
stale and ignored by attention (masked), then overwritten by the next write. So rolling back
rejected draft tokens is `truncate(lengths)`: it moves a number, nothing else.

Lengths live twice: on the host (the source of truth for Python-side logic, so no device sync
is needed to size a step) and as a device tensor (what kernels and CUDA graphs read). On CUDA a
host change reaches the device through a pinned buffer, non-blocking (a pageable copy would
block the host); a graph that moves the device lengths itself is mirrored on the host with
`note_advanced` / `note_lengths`, which touch the host copy only.
"""
from __future__ import annotations

import torch

from specrt.errors import CapacityError, MemoryCapacityError
from specrt.model.files import human_bytes
from specrt.model.staging import wait_for


class StaticKVCache:
    def __init__(self, num_layers: int, max_batch_size: int, num_kv_heads: int,
                 max_seq_len: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", slack: int = 0):
        """slack: positions allocated past max_seq_len for the padding of fixed-shape passes
        (every row computes T tokens, a full row's too): rows never hold more than
        max_seq_len tokens, but a padded pass may write up to `capacity` without falling back
        to another way of computing (whose bits would differ from the decode steps')."""
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.capacity = max_seq_len + slack                 # positions allocated per row
        shape = (num_layers, max_batch_size, num_kv_heads, self.capacity, head_dim)
        check_fits(shape, dtype, device, slack)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, B, Hkv, S, D]
        self._host_lengths = torch.zeros(max_batch_size, dtype=torch.int64)  # [B] host
        self.lengths = torch.zeros(max_batch_size, dtype=torch.int64, device=device)  # [B]
        # CUDA: the pinned source of the host -> device copy, and the event that says the last
        # copy has read it (see `_set`).
        cuda = self.lengths.is_cuda
        self._pinned = torch.zeros(max_batch_size, dtype=torch.int64, pin_memory=True) \
            if cuda else None                                                    # [B] host
        self._copied = torch.cuda.Event() if cuda else None

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2

    def host_lengths(self) -> list[int]:
        return self._host_lengths.tolist()

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer, [B, Hkv, S, D] views into the preallocated storage."""
        return self.k[index], self.v[index]

    # --- the only ways lengths change -------------------------------------------------------
    def advance(self, counts: list[int]) -> None:
        """Mark `counts[row]` more positions of each row valid (after a forward wrote them)."""
        new = self._host_lengths[: len(counts)] + torch.tensor(counts, dtype=torch.int64)
        if int(new.max()) > self.max_seq_len:
            raise CapacityError(f"KV cache overflow: a row would hold {int(new.max())} tokens but "
                                f"max_seq_len is {self.max_seq_len}; raise max_seq_len")
        self._set(new)

    def truncate(self, lengths: list[int]) -> None:
        """Roll rows back to `lengths` (O(1): no data moves). Never grows a row."""
        new = torch.tensor(lengths, dtype=torch.int64)
        if bool((new > self._host_lengths[: len(lengths)]).any()) or bool((new < 0).any()):
            raise ValueError(f"truncate can only shrink rows: have {self.host_lengths()}, "
                             f"asked for {lengths}")
        self._set(new)

    def note_advanced(self, rows: int, count: int) -> None:
        """A static (graph-captured) forward advanced the device lengths of the first `rows`
        rows by `count`; mirror that on the host without touching the device tensor."""
        self._host_lengths[:rows] += count

    def note_lengths(self, lengths: list[int]) -> None:
        """A static forward set the device lengths of the first len(lengths) rows to
        `lengths`; mirror that on the host without touching the device tensor."""
        self._host_lengths[: len(lengths)] = torch.tensor(lengths, dtype=torch.int64)

    def reset(self) -> None:
        self._host_lengths.zero_()
        self.lengths.zero_()

    def rows(self, start: int, stop: int) -> "StaticKVCache":
        """Rows start..stop-1 as a cache of their own: a view sharing storage and lengths, so
        a pass over some rows (one request's prefill, a chunk of a batch) reads and writes
        exactly what a pass over the whole cache would."""
        view = object.__new__(StaticKVCache)
        view.max_batch_size = stop - start
        view.max_seq_len = self.max_seq_len
        view.capacity = self.capacity
        view.k = self.k[:, start:stop]                                # [L, b, Hkv, S, D]
        view.v = self.v[:, start:stop]
        view._host_lengths = self._host_lengths[start:stop]
        view.lengths = self.lengths[start:stop]
        view._pinned = self._pinned[start:stop] if self._pinned is not None else None
        view._copied = self._copied                   # one event guards the whole pinned buffer
        return view

    def _set(self, new: torch.Tensor) -> None:
        n = new.shape[0]
        self._host_lengths[:n] = new
        if self._pinned is None:
            self.lengths.copy_(self._host_lengths, non_blocking=True)
            return
        # CUDA only. Wait until the previous copy has read the pinned buffer (inside a graphed
        # round it has: the round's read-back came after it), then queue this one.
        wait_for(self._copied)
        self._pinned.copy_(self._host_lengths)
        self.lengths.copy_(self._pinned, non_blocking=True)
        self._copied.record()


def available_memory(device: torch.device | str) -> int:
    """Bytes that can be allocated on `device` now: free GPU memory, or the RAM the kernel
    reports available (page cache it can drop included)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "meta":
        return 1 << 62
    import psutil

    return psutil.virtual_memory().available


def check_fits(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
               slack: int = 0) -> None:
    """Refuse a K/V pair of `shape` that cannot fit, before the allocator is asked (which on
    Linux may hand out the address space and let the OOM killer end the process later).
    slack: how many of the shape's positions are StaticKVCache's slack, not max_seq_len."""
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        return      # a wrong-type size is refused by the argument checks, not by arithmetic here
    layers, batch, heads, seq, head_dim = shape
    elsize = torch.empty((), dtype=dtype).element_size()
    need = 2 * layers * batch * heads * seq * head_dim * elsize
    have = available_memory(device)
    if need > have:
        positions = (f"(max_seq_len {seq - slack} + {slack} for padded passes)" if slack
                     else f"max_seq_len {seq}")
        raise MemoryCapacityError(
            f"the KV cache needs {human_bytes(need)} (K and V x {layers} layers x "
            f"max_batch_size {batch} x {heads} KV heads x {positions} x head_dim {head_dim} x "
            f"{elsize} bytes), this machine has {human_bytes(have)} available on "
            f"{torch.device(device)}; lower max_seq_len or max_batch_size")
