"""The draft model's decode loop on static buffers, replayed as one CUDA graph per round.

`steps` draft decode steps, each feeding its guess (argmax, or a draw argmax(p / E) with
E ~ Exp(1) pre-drawn into a static buffer) to the next, with no host sync inside. On the CPU
the same body runs eagerly on the same buffers (see `specrt.model.graphs`).
"""
from __future__ import annotations

import torch

from specrt.kernels.reference import fill_exponential_
from specrt.model.graphs import StaticRunner
from specrt.model.kv_cache import StaticKVCache
from specrt.model.transformer import Transformer
from specrt.spec.sampling import SamplingParams, warp


class StaticDraftLoop(StaticRunner):
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
            fill_exponential_(self.noise, generator)
        self._replay()
        self.cache.note_advanced(B, self.steps)
        return self.tokens, self.probs
