"""The draft model's proposal on static buffers: catch-up and K - 1 steps, one CUDA graph.

One replay per round does what `DraftModelDrafter.propose` does eagerly:
1. the catch-up: each row's unseen committed tokens (1 or 2 of them; longer catch-ups are fed
   eagerly first) in one forward of width T_c = 1 or 2. A row with fewer tokens than T_c is
   right-padded: the padding's K/V land past the row's length, which is then set to
   start + valid, so the next step overwrites them (stale slots are masked until then);
2. the first guess, at each row's last valid position;
3. K - 1 decode steps, each feeding its guess to the next.
A guess is the argmax; in a sampled loop (`sampled`), a sampled row's guess is its draw
argmax(q / E) from its warped distribution q (`warp_rows`, settings staged per row), with the
Exp(1) noise E drawn before the replay from the row's own generator, in the order the eager
path draws it (`stage_inputs`), so both give the same guesses; q of every guess is kept for the
acceptance test (`probs`, on the target's vocabulary axis, zero past the draft's).
Inactive rows run too (their tokens are garbage, replaced by NO_DRAFT); the drafter's rollback
puts their length back. There is no host sync inside: the inputs come through pinned
`Staging` buffers, the guesses stay on the device for the verify graph to read. On the CPU the
same body runs eagerly on the same buffers (see `specrt.model.graphs`).
"""
from __future__ import annotations

import torch

from specrt.kernels import argmax, fill_exponential_
from specrt.model.graphs import GraphPool, SharedScratch, StaticRunner
from specrt.model.kv_cache import StaticKVCache
from specrt.model.staging import Staging
from specrt.model.transformer import Transformer
from specrt.spec.drafters.base import LONG_CATCH_UP, NO_DRAFT
from specrt.spec.sampling import SamplingParams, param_staging, race, stage_params, warp_rows

# What a row can have unseen after the eager part (longer catch-ups run on their own first).
CATCH_UP_WIDTHS = tuple(range(1, LONG_CATCH_UP + 1))


class StaticDraftLoop(StaticRunner):
    """Staged catch-up tokens [B, T_c] -> guesses [B, K] (`tokens`, on the device), and in a
    sampled loop their q [B, K, V_target] (`probs`)."""

    def __init__(self, model: Transformer, cache: StaticKVCache, batch_size: int, k: int,
                 catch_up: int, common_vocab: int, use_graph: bool, pool: GraphPool | None = None,
                 scratch: "DraftScratch | None" = None):
        super().__init__(model, cache, use_graph, pool)
        device = model.device
        self.k, self.catch_up, self.common_vocab = k, catch_up, common_vocab
        # columns: the catch-up ids [0, T_c), then valid (1..T_c), then active (0/1)
        self.stage = Staging((batch_size, catch_up + 2), torch.int64, device)  # [B, T_c + 2]
        self.stage.device[:, catch_up] = 1         # a valid width for the capture's warm-up
        self.start = torch.zeros(batch_size, dtype=torch.int64, device=device)   # [B]
        self.tokens = torch.zeros(batch_size, k, dtype=torch.int64, device=device)  # [B, K]
        self.sampled = scratch is not None
        if scratch is not None:
            self.params = param_staging(batch_size, device)  # [B, 4] staged warp settings
            self.noise = scratch.noise(batch_size, k)                         # [B, K, V_c]
            self.probs = scratch.probs(batch_size, k)                         # [B, K, V_target]

    def describe(self) -> str:
        B = self.tokens.shape[0]
        kind = ", sampled" if self.sampled else ""
        return f"StaticDraftLoop(B={B}, K={self.k}, T_c={self.catch_up}{kind})"

    def _body(self) -> None:
        B, Tc, V = self.tokens.shape[0], self.catch_up, self.common_vocab
        ids, valid = self.stage.device[:, :Tc], self.stage.device[:, Tc]        # [B, T_c], [B]
        active = self.stage.device[:, Tc + 1]                                     # [B]
        self.start.copy_(self.cache.lengths[:B])
        logits = self.model.forward_static(ids, self.cache)[:, :, :V]            # [B, T_c, V]
        self.cache.lengths[:B] = self.start + valid      # the padding is stale from here on
        last = (valid - 1).clamp(min=0).view(B, 1, 1).expand(B, 1, V)
        self._guess(0, logits.gather(1, last)[:, 0])
        for i in range(1, self.k):
            token = self.tokens[:, i - 1: i]                                      # [B, 1]
            self._guess(i, self.model.forward_static(token, self.cache)[:, 0, :V])
        self.tokens.masked_fill_(active[:, None] == 0, NO_DRAFT)

    def _guess(self, i: int, logits: torch.Tensor) -> None:                   # logits [B, V_c]
        """Guess i of every row: the argmax, or a sampled row's draw (as `choose_rows`)."""
        if not self.sampled:
            self.tokens[:, i] = argmax(logits)
            return
        rows = self.params.device                                                 # [B, 4]
        q = warp_rows(logits, rows)                                               # [B, V_c]
        self.probs[:, i, : logits.shape[-1]] = q
        drawn = race(q, self.noise[:, i])                                        # [B]
        self.tokens[:, i] = torch.where(rows[:, 3] > 0, drawn, argmax(logits))

    def stage_inputs(self, pending: list[list[int]], active: list[bool],
                     params: list[SamplingParams] | None = None,
                     generators: list[torch.Generator | None] | None = None) -> list[int]:
        """Write each row's catch-up (1..T_c tokens; inactive rows: none) into the pinned
        buffer and queue its copy; a sampled loop also stages each row's warp settings
        (`params`) and draws each active sampled row's noise for its K guesses from its
        generator, one Exp(1) vector per guess as the eager path draws them. Returns [B] the
        tokens each row's cache advances by (valid + K - 1), which the caller mirrors on the
        host."""
        if self.sampled:
            stage_params(self.params, params, self.common_vocab)
            for b, (p, a) in enumerate(zip(params, active)):
                if a and not p.greedy:
                    for i in range(self.k):
                        fill_exponential_(self.noise[b, i], generators[b])
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


class DraftScratch:
    """The noise and q buffers of a drafter's sampled loops, shared by all of them (they run
    one at a time, and the round copies q out before the next replay)."""

    def __init__(self, max_batch_size: int, max_k: int, common_vocab: int, target_vocab: int,
                 device: torch.device):
        rows = max_batch_size * max_k
        self._noise = SharedScratch(rows * common_vocab, 1.0, device)
        # the tail past the draft's vocabulary is never written: q there stays 0
        self._probs = SharedScratch(rows * target_vocab, 0.0, device)
        self.common_vocab, self.target_vocab = common_vocab, target_vocab

    def noise(self, batch_size: int, k: int) -> torch.Tensor:              # [B, K, V_c]
        return self._noise.view(batch_size, k, self.common_vocab)

    def probs(self, batch_size: int, k: int) -> torch.Tensor:              # [B, K, V_target]
        return self._probs.view(batch_size, k, self.target_vocab)
