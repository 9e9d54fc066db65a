"""The draft model's greedy proposal on static buffers: catch-up and K - 1 steps, one CUDA graph.

One replay per round does what `DraftModelDrafter.propose` does eagerly for greedy rows:
1. the catch-up: each row's unseen committed tokens (1 or 2 of them; longer catch-ups are fed
   eagerly first) in one forward of width T_c = 1 or 2. A row with fewer tokens than T_c is
   right-padded: the padding's K/V land past the row's length, which is then set to
   start + valid, so the next step overwrites them (stale slots are masked until then);
2. the first guess: the argmax at each row's last valid position;
3. K - 1 decode steps, each feeding its guess to the next.
Inactive rows run too (their tokens are garbage, replaced by NO_DRAFT); the drafter's rollback
puts their length back. There is no host sync inside: the inputs come through a pinned
`Staging` buffer, the guesses stay on the device for the verify graph to read. On the CPU the
same body runs eagerly on the same buffers (see `specrt.model.graphs`).
"""
from __future__ import annotations

import torch

from specrt.model.graphs import GraphPool, StaticRunner
from specrt.model.kv_cache import StaticKVCache
from specrt.model.staging import Staging
from specrt.model.transformer import Transformer
from specrt.spec.drafters.base import NO_DRAFT

CATCH_UP_WIDTHS = (1, 2)   # = 1 .. LONG_CATCH_UP: what a row can have unseen after the eager part


class StaticDraftLoop(StaticRunner):
    """Greedy: staged catch-up tokens [B, T_c] -> guesses [B, K] (`tokens`, on the device)."""

    def __init__(self, model: Transformer, cache: StaticKVCache, batch_size: int, k: int,
                 catch_up: int, common_vocab: int, use_graph: bool, pool: GraphPool | None = None):
        super().__init__(model, cache, use_graph, pool)
        device = model.device
        self.k, self.catch_up, self.common_vocab = k, catch_up, common_vocab
        # columns: the catch-up ids [0, T_c), then valid (1..T_c), then active (0/1)
        self.stage = Staging((batch_size, catch_up + 2), torch.int64, device)  # [B, T_c + 2]
        self.stage.device[:, catch_up] = 1         # a valid width for the capture's warm-up
        self.start = torch.zeros(batch_size, dtype=torch.int64, device=device)   # [B]
        self.tokens = torch.zeros(batch_size, k, dtype=torch.int64, device=device)  # [B, K]

    def describe(self) -> str:
        B = self.tokens.shape[0]
        return f"StaticDraftLoop(B={B}, K={self.k}, T_c={self.catch_up})"

    def _body(self) -> None:
        B, Tc, V = self.tokens.shape[0], self.catch_up, self.common_vocab
        ids, valid = self.stage.device[:, :Tc], self.stage.device[:, Tc]        # [B, T_c], [B]
        active = self.stage.device[:, Tc + 1]                                     # [B]
        self.start.copy_(self.cache.lengths[:B])
        logits = self.model.forward_static(ids, self.cache)[:, :, :V]            # [B, T_c, V]
        self.cache.lengths[:B] = self.start + valid      # the padding is stale from here on
        last = (valid - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, V)
        self.tokens[:, 0] = logits.gather(1, last)[:, 0].argmax(dim=-1)
        for i in range(1, self.k):
            token = self.tokens[:, i - 1: i]                                      # [B, 1]
            logits = self.model.forward_static(token, self.cache)[:, 0, :V]       # [B, V]
            self.tokens[:, i] = logits.argmax(dim=-1)
        self.tokens.masked_fill_(active[:, None] == 0, NO_DRAFT)

    def stage_inputs(self, pending: list[list[int]], active: list[bool]) -> list[int]:
        """Write each row's catch-up (1..T_c tokens; inactive rows: none) into the pinned
        buffer and queue its copy. Returns [B] the tokens each row's cache advances by
        (valid + K - 1), which the caller mirrors on the host."""
        Tc = self.catch_up
        host = self.stage.write()                                                 # [B, T_c + 2]
        host[:] = 0
        valid = []
        for b, (p, a) in enumerate(zip(pending, active)):
            n = len(p) if a else 0
            host[b, :n] = p[:n]
            host[b, Tc] = max(n, 1)
            host[b, Tc + 1] = int(a)
            valid.append(max(n, 1))
        self.stage.push()
        return [v + self.k - 1 for v in valid]
