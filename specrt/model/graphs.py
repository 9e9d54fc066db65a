"""Static-buffer runners, replayed as CUDA graphs: the base `StaticRunner` and the verify pass.

A CUDA graph replays a fixed sequence of kernels on fixed memory, which removes the per-kernel
launch cost that dominates a small draft model's decode step. So everything a runner touches is
allocated once, at construction: its input and output buffers, the noise for sampling, and the
KV cache it writes (positions and lengths are device tensors inside the cache, advanced by the
captured kernels themselves). Per (batch size, K, sampling settings) there is one runner.

- StaticForward (here): one target forward of T = K + 1 tokens (the verify pass).
- StaticDraftLoop (`specrt.spec.drafters.draft_loop`): the draft model's K - 1 decode steps.

On CUDA the body is captured once after a warm-up and replayed each round. Elsewhere the same
body runs eagerly on the same buffers, so CPU tests exercise exactly the buffer discipline the
graph relies on. After a replay the caller mirrors the length change on the host
(`StaticKVCache.note_advanced`), since the graph advanced only the device copy.
"""
from __future__ import annotations

import torch

from specrt.model.kv_cache import StaticKVCache
from specrt.model.transformer import Transformer

WARMUP = 2


class StaticRunner:
    def __init__(self, model: Transformer, cache: StaticKVCache, use_graph: bool):
        self.model = model
        self.cache = cache
        self.graph = None
        self._use_graph = use_graph and model.device.type == "cuda"

    def _body(self) -> None:
        raise NotImplementedError

    def _replay(self) -> None:
        if not self._use_graph:
            self._body()
            return
        if self.graph is None:
            self._capture()
        self.graph.replay()

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
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA work (another engine of the same LLM) must not
        # invalidate this capture.
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self._body()
        self.cache.lengths.copy_(saved)      # capture records; warm-up really advanced them

    def buffers(self) -> list[torch.Tensor]:
        """Every static buffer (for tests that check nothing is reallocated)."""
        return [v for v in vars(self).values() if isinstance(v, torch.Tensor)]


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
        self._replay()
        self.cache.note_advanced(B, T)
        return self.logits
