"""Static-buffer runners, replayed as CUDA graphs: the base `StaticRunner`, the shared
`GraphPool`, and a plain target forward (`StaticForward`).

A CUDA graph replays a fixed sequence of kernels on fixed memory, which removes the per-kernel
launch cost that dominates a small draft model's decode step. So everything a runner touches is
allocated once, at construction: its input and output buffers and the KV cache it writes
(positions and lengths are device tensors inside the cache, moved by the captured kernels
themselves). Per shape there is one runner:

- StaticForward (here): one forward of T tokens (the cost calibration of a graphed engine,
  benchmarks and tests).
- StaticVerify (`specrt.engine.static_round`): the verify pass with acceptance (greedy, or
  with rejection sampling for sampled rows) and the target cache's rollback; one per
  (B, T = K + 1, greedy or sampled).
- StaticDraftLoop (`specrt.spec.drafters.draft_loop`): the draft model's catch-up and its K - 1
  steps; one per (B, K, catch-up width 1 or 2, greedy or sampled).

On CUDA the body is captured after a warm-up (`capture`, called for every shape at engine load
by `Engine.warm_up`) and replayed each round. Elsewhere the same body runs eagerly on the same
buffers, so CPU tests exercise exactly the buffer discipline the graph relies on. After a
replay the caller mirrors the length change on the host (`StaticKVCache.note_advanced` /
`note_lengths`), since the graph moved only the device copy.

All graphs of an engine share one memory pool (`GraphPool`). That is safe because no tensor
allocated during a capture outlives it: every value a caller reads is copied into a buffer
allocated before the capture, so a graph's pool memory is scratch that any other graph may
reuse, and graphs run one at a time on one stream, in any order.
"""
from __future__ import annotations

import logging
import math

import torch

from specrt.model.kv_cache import StaticKVCache
from specrt.model.staging import ReadBack, Staging
from specrt.model.transformer import Transformer

WARMUP = 2
log = logging.getLogger("specrt.graphs")


class GraphPool:
    """The one CUDA graph memory pool an engine's graphs share (None off CUDA)."""

    def __init__(self, device: torch.device):
        self.handle = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.captured = 0                  # graphs captured into it (tests, logs)


class StaticRunner:
    def __init__(self, model: Transformer, cache: StaticKVCache, use_graph: bool,
                 pool: GraphPool | None = None):
        self.model = model
        self.cache = cache
        self.graph = None
        self.pool = pool
        self._use_graph = use_graph and model.device.type == "cuda"

    def _body(self) -> None:
        raise NotImplementedError

    @torch.inference_mode()    # buffers may be inference tensors (built under inference mode)
    def replay(self) -> None:
        """Run the body: the captured graph on CUDA (captured now if it was not), eagerly
        elsewhere."""
        if not self._use_graph:
            self._body()
            return
        if self.graph is None:
            if self.pool is not None:      # an engine's runner: Engine.warm_up missed this shape
                log.warning("%s captured mid-generation, not at load", self.describe())
            self._capture()
        self.graph.replay()

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture the graph now (a no-op off CUDA, or once captured)."""
        if self._use_graph and self.graph is None:
            self._capture()

    def describe(self) -> str:
        return type(self).__name__

    def _capture(self) -> None:
        saved = self.cache.lengths.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(WARMUP):          # warm-up compiles kernels and settles allocators
                self.cache.lengths.copy_(saved)
                self._body()
        torch.cuda.current_stream().wait_stream(stream)
        self.cache.lengths.copy_(saved)
        from specrt.kernels.triton import tickets     # torch only: no Triton import

        tickets.prepare_capture(self.model.device, stream)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA work (another engine of the same LLM) must not
        # invalidate this capture.
        pool = self.pool.handle if self.pool is not None else None
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self._body()
        self.cache.lengths.copy_(saved)      # capture records; warm-up really advanced them
        if self.pool is not None:
            self.pool.captured += 1

    def buffers(self) -> list[torch.Tensor]:
        """Every static buffer (for tests that check nothing is reallocated)."""
        out = []
        for v in vars(self).values():
            if isinstance(v, torch.Tensor):
                out.append(v)
            elif isinstance(v, (Staging, ReadBack)):
                out += v.tensors()
        return out


class SharedScratch:
    """One flat fp32 buffer that runners replaying one at a time share, each through a
    contiguous view of its own shape (`view`), so runners of every shape use the same memory,
    sized for the largest. Safe only for contents written before each replay that reads them."""

    def __init__(self, numel: int, fill: float, device: torch.device):
        self._flat = torch.full((numel,), fill, dtype=torch.float32, device=device)

    def view(self, *shape: int) -> torch.Tensor:
        return self._flat[:math.prod(shape)].view(*shape)


class StaticForward(StaticRunner):
    """ids [B, T] -> fp32 logits [B, T, V], on static buffers."""

    def __init__(self, model: Transformer, cache: StaticKVCache, batch_size: int, t: int,
                 use_graph: bool):
        super().__init__(model, cache, use_graph)
        self.ids = torch.zeros(batch_size, t, dtype=torch.int64, device=model.device)
        self.logits = torch.zeros(batch_size, t, model.cfg.vocab_size, dtype=torch.float32,
                                  device=model.device)

    def _body(self) -> None:
        self.logits.copy_(self.model.forward_static(self.ids, self.cache))

    def run(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = self.ids.shape
        self.ids.copy_(ids)
        self.replay()
        self.cache.note_advanced(B, T)
        return self.logits
