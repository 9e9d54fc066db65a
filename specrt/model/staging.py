"""Host <-> device traffic of a graphed round: pinned staging in, one read-back out.

A CUDA copy from pageable host memory is staged by the driver and blocks the host, and a
`torch.tensor(list, device=...)` does the same; both would sync the host with the GPU inside a
round. So a graphed round writes its inputs into a pinned host buffer (`Staging.write`) and
copies it into a static device buffer with `non_blocking=True` (`Staging.push`): the copy is
queued on the stream ahead of the graph replays that read it. Its outputs come back through
`ReadBack.read`: one non-blocking copy into pinned memory and one event wait, the round's one
host sync.

A pinned buffer must not be rewritten while a queued copy may still read it, so each
`Staging` records an event after its copy and `write` waits on it. Inside a graphed round the
previous copy finished before the previous round's read-back returned, so that wait never
stalls; it only guards callers that stage twice with no read-back between.

On the CPU the same buffers exist (the host side unpinned) and every copy is a plain copy, so
CPU tests run the same staging and read-back code. This module must not decide what is
staged: the runners (`specrt.model.graphs`, `specrt.engine.static_round`) do.
"""
from __future__ import annotations

import torch


def wait_for(event) -> None:
    """Wait for a recorded CUDA event only if it has not completed: `query` is no sync, so a
    copy that finished long ago (the usual case inside a graphed round) costs no host sync."""
    if not event.query():
        event.synchronize()


class Staging:
    """A host buffer (pinned on CUDA) and its static device twin of the same shape."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.device = torch.zeros(shape, dtype=dtype, device=device)   # what the graphs read
        self._cuda = self.device.is_cuda
        self.host = torch.zeros(shape, dtype=dtype, pin_memory=self._cuda)
        self._copied = torch.cuda.Event() if self._cuda else None

    def write(self):
        """The host buffer as a numpy array (writes go straight into pinned memory, with no
        tensor built from a Python list), once the previous `push` has finished reading it."""
        if self._copied is not None:
            wait_for(self._copied)         # CUDA only; already complete inside a graphed round
        return self.host.numpy()

    def push(self) -> None:
        """Queue the host -> device copy (asynchronous on CUDA)."""
        self.device.copy_(self.host, non_blocking=self._cuda)
        if self._copied is not None:
            self._copied.record()          # CUDA only

    def tensors(self) -> list[torch.Tensor]:
        return [self.device, self.host]


class ReadBack:
    """A pinned host buffer that receives a static device buffer: `read` is the host sync."""

    def __init__(self, source: torch.Tensor):
        self.source = source                                           # static device buffer
        self._cuda = source.is_cuda
        self.host = torch.zeros(source.shape, dtype=source.dtype, pin_memory=self._cuda)
        self._ready = torch.cuda.Event() if self._cuda else None
        self.count = 0                     # reads so far: tests check one per round

    def read(self) -> list:
        """Copy `source` to the host and wait for it: the one host sync of a graphed round.
        Returns it as nested Python lists."""
        self.count += 1
        self.host.copy_(self.source, non_blocking=self._cuda)
        if self._ready is not None:
            self._ready.record()           # CUDA only
            self._ready.synchronize()      # CUDA only: the sync
        return self.host.tolist()

    def tensors(self) -> list[torch.Tensor]:
        return [self.source, self.host]
