"""Static-buffer runners for the draft loop and the verify pass, replayed as CUDA graphs.

A CUDA graph replays a fixed sequence of kernels on fixed memory, which removes the per-kernel
launch cost that dominates a small draft model's decode step. So everything a runner touches is
allocated once, at construction: its input and output buffers, the noise for sampling, and the
KV cache it writes (positions and lengths are device tensors inside the cache, advanced by the
captured kernels themselves). Per (batch size, K, sampling settings) there is one runner.

- StaticForward: one target forward of T = K + 1 tokens (the verify pass).
- StaticDraftLoop: `steps` draft decode steps, each feeding its guess (argmax, or a draw
  argmax(p / E) with E ~ Exp(1) pre-drawn into a static buffer) to the next, with no host
  sync inside.

On CUDA the body is captured once after a warm-up and replayed each round. Elsewhere the same
body runs eagerly on the same buffers, so CPU tests exercise exactly the buffer discipline the
graph relies on. After a replay the caller mirrors the length change on the host
(`StaticKVCache.note_advanced`), since the graph advanced only the device copy.
"""
from __future__ import annotations

import torch

from specrt.config import SamplingParams
from specrt.kv_cache import StaticKVCache
from specrt.model import Transformer
from specrt.sampling import warp

WARMUP = 2


class _Runner:
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


class StaticForward(_Runner):
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


class StaticDraftLoop(_Runner):
    """`steps` draft decode steps from a first guess [B] -> guesses [B, steps] (+ their
    warped distributions [B, steps, V_target] when sampling)."""

    def __init__(self, model: Transformer, cache: StaticKVCache, batch_size: int, steps: int,
                 params: SamplingParams, common_vocab: int, target_vocab: int, use_graph: bool):
        super().__init__(model, cache, use_graph)
        device = model.device
        self.params = params
        self.steps = steps
        self.common_vocab = common_vocab
        self.first = torch.zeros(batch_size, 1, dtype=torch.int64, device=device)
        self.tokens = torch.zeros(batch_size, steps, dtype=torch.int64, device=device)
        if params.greedy:
            self.noise = self.probs = None
        else:
            self.noise = torch.ones(steps, batch_size, common_vocab, device=device)
            self.probs = torch.zeros(batch_size, steps, target_vocab, device=device)

    def _body(self) -> None:
        token = self.first
        for i in range(self.steps):
            logits = self.model.forward_static(token, self.cache)[:, 0, : self.common_vocab]
            if self.params.greedy:
                self.tokens[:, i] = logits.argmax(dim=-1)
            else:
                p = warp(logits, self.params)                       # [B, V_common]
                self.probs[:, i, : self.common_vocab] = p
                self.tokens[:, i] = (p / self.noise[i]).argmax(dim=-1)
            token = self.tokens[:, i: i + 1]

    def run(self, first: torch.Tensor, generator: torch.Generator | None):
        B = self.first.shape[0]
        self.first.copy_(first[:, None])
        if self.noise is not None:
            self.noise.exponential_(generator=generator).clamp_(min=1e-20)
        self._replay()
        self.cache.note_advanced(B, self.steps)
        return self.tokens, self.probs
