"""A greedy speculative round on CUDA: two graph replays and one host sync.

The contract is `specrt.engine.round`'s; this is how an engine with graphs (`Engine(static=
True)`) carries it out when every generating row is greedy:

  host      the planner chooses; the drafter stages its inputs (`propose_staged`: pinned
            buffer, non-blocking copy); the verify runner stages [last token, generating,
            drafts] the same way;
  device    (`StaticRound.device_section`) the draft graph replays (catch-up + K - 1 steps,
            `StaticDraftLoop`), its guesses are copied device-to-device into the verify
            runner's input, and the verify graph replays: the target's forward of K + 1
            tokens, greedy acceptance (`specrt.kernels.greedy_accept`) and the rollback of the
            target cache's device lengths, leaving [B] accepted counts, [B, K + 1] tokens and
            the [B, K] drafts in one static buffer;
  host      one read-back of that buffer (`ReadBack.read`: the round's only sync), from which
            the committed tokens, the target cache's host lengths (`note_lengths`), the
            drafter's seen counts (its `rollback`) and the planner's observation all follow.

Nothing in the device section reads a device value on the host or builds a tensor from a
Python list (tests run it under a dispatch mode that fails on either). On the CPU the same
runners run their bodies eagerly, so CPU tests exercise this whole path.

Sampled rows, or a batch whose cache rows have no room for a static pass, take
`round.verify_and_accept`'s general path (more syncs: acceptance reads logits row by row), on
the same verify runner's logits when the shape fits. Timing: on this path `draft_seconds` is
only the staging; the draft graph's GPU time lands in `verify_seconds`.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, ContextManager

import torch

from specrt.kernels import greedy_accept
from specrt.model.graphs import GraphPool, StaticRunner
from specrt.model.kv_cache import StaticKVCache
from specrt.model.staging import ReadBack, Staging
from specrt.model.transformer import Transformer
from specrt.spec.config import MAX_SPECULATIVE_TOKENS
from specrt.spec.drafters.base import NO_DRAFT, DraftContext, Proposal

if TYPE_CHECKING:
    from specrt.engine.round import RoundOutcome

MAX_T = MAX_SPECULATIVE_TOKENS + 1      # the widest verify pass: K_max drafts + the last token


class StaticVerify(StaticRunner):
    """Staged [last, generating, drafts] [B, T + 1] -> target forward of T = K + 1 tokens,
    greedy acceptance and the target cache's rollback, all on the device. `result` [B, 2T]
    holds per row: accepted count, the K + 1 output tokens (-1 after the committed ones), the
    K drafts."""

    def __init__(self, model: Transformer, cache: StaticKVCache, batch_size: int, t: int,
                 logits: torch.Tensor, pool: GraphPool | None):
        super().__init__(model, cache, True, pool)
        device = model.device
        # columns: the last committed token, generating (0/1), then the K drafts (NO_DRAFT pads)
        self.stage = Staging((batch_size, t + 1), torch.int64, device)          # [B, T + 1]
        self.ids = torch.zeros(batch_size, t, dtype=torch.int64, device=device)  # [B, T]
        self.start = torch.zeros(batch_size, dtype=torch.int64, device=device)   # [B]
        self.logits = logits[:batch_size, :t]        # [B, T, V] view of the round's buffer
        self.result = torch.zeros(batch_size, 2 * t, dtype=torch.int64, device=device)
        self.read_back = ReadBack(self.result)                                    # [B, 2T]

    def describe(self) -> str:
        B, T = self.ids.shape
        return f"StaticVerify(B={B}, T={T})"

    def _body(self) -> None:
        B, T = self.ids.shape
        staged = self.stage.device                                               # [B, T + 1]
        drafts = staged[:, 2:]                                                   # [B, K]
        self.ids[:, 0] = staged[:, 0]
        self.ids[:, 1:] = drafts.clamp(min=0)
        self.start.copy_(self.cache.lengths[:B])
        self.logits.copy_(self.model.forward_static(self.ids, self.cache))
        n, out = greedy_accept(self.logits, drafts)          # [B] int32, [B, K + 1] int64
        n = n.to(torch.int64)
        # Keep the last token and the accepted drafts of generating rows; others keep nothing.
        self.cache.lengths[:B] = self.start + staged[:, 1] * (1 + n)
        self.result[:, 0] = n
        self.result[:, 1: T + 1] = out
        self.result[:, T + 1:] = drafts

    def stage_inputs(self, last: list[int], generating: list[bool],
                     proposal: Proposal | None) -> None:
        """Write the host inputs into the pinned buffer and queue their copy. Drafts already
        on the device (a draft graph's output) are copied in by `take_drafts` instead."""
        host = self.stage.write()                                                # [B, T + 1]
        host[:, 0] = last
        host[:, 1] = [int(g) for g in generating]
        host[:, 2:] = NO_DRAFT
        if proposal is not None and not self.drafts_on_device(proposal):
            host[:, 2:] = proposal.tokens.numpy()        # host drafts (n-gram) on a CUDA engine
        self.stage.push()

    def drafts_on_device(self, proposal: Proposal) -> bool:
        return proposal.tokens.device == self.ids.device

    def take_drafts(self, tokens: torch.Tensor) -> None:  # [B, K] on the device
        self.stage.device[:, 2:].copy_(tokens)


class StaticRound:
    """The verify runners of an engine with graphs, the shared logits buffer they write, and
    the greedy round's host part (`greedy_round`)."""

    def __init__(self, target: Transformer, cache: StaticKVCache, max_batch_size: int,
                 pool: GraphPool):
        self.target, self.cache, self.pool = target, cache, pool
        # One logits buffer for every runner: graphs replay one at a time, and the sampled path
        # reads it before the next replay.
        self.logits = torch.zeros(max_batch_size, MAX_T, target.cfg.vocab_size,
                                  dtype=torch.float32, device=target.device)  # [Bmax, T, V]
        self._verify: dict[tuple[int, int], StaticVerify] = {}
        # Entered around every device section: tests put a no-sync checker here.
        self.section_guard: Callable[[], ContextManager] = contextlib.nullcontext

    def verify(self, batch_size: int, t: int) -> StaticVerify:
        """The verify runner for [batch_size, t] passes, built on first use."""
        runner = self._verify.get((batch_size, t))
        if runner is None:
            runner = self._verify[(batch_size, t)] = StaticVerify(
                self.target, self.cache, batch_size, t, self.logits, self.pool)
        return runner

    def capture_all(self, batch_sizes, max_k: int) -> None:
        """Build and (on CUDA) capture the runner of every (B, T = 1..max_k + 1)."""
        for B in batch_sizes:
            for t in range(1, max_k + 2):
                self.verify(B, t).capture()

    def runners(self) -> list[StaticVerify]:
        return list(self._verify.values())

    @property
    def read_backs(self) -> int:
        """Host syncs of greedy rounds so far (one per round)."""
        return sum(r.read_back.count for r in self._verify.values())

    def fits(self, batch_size: int, t: int) -> bool:
        """A static pass writes t positions on every row of the batch: is there room?"""
        return t <= MAX_T and max(self.cache.host_lengths()[:batch_size]) + t <= \
            self.cache.max_seq_len

    def forward(self, last: list[int], generating: list[bool],
                proposal: Proposal | None) -> torch.Tensor:
        """The sampled path: one verify replay, then the logits [B, T, V] for host-side
        acceptance. The host lengths advance by T; the caller truncates (which also resets
        the device lengths the graph's greedy rollback moved)."""
        B, T = len(last), (proposal.k if proposal is not None else 0) + 1
        runner = self.verify(B, T)
        runner.stage_inputs(last, generating, proposal)
        self.device_section(runner, proposal)
        self.cache.note_advanced(B, T)
        return runner.logits

    def greedy_round(self, last: list[int], generating: list[bool], proposal: Proposal | None,
                     ctx: DraftContext) -> "RoundOutcome | None":
        """The round's verify, acceptance and target rollback with one host sync; None when
        it does not apply (a sampled generating row, or no room), and nothing was run."""
        from specrt.engine.round import RoundOutcome

        B, T = len(last), (proposal.k if proposal is not None else 0) + 1
        if not self.fits(B, T) or (proposal is not None and proposal.probs is not None) or \
                any(g and not p.greedy for g, p in zip(generating, ctx.params)):
            return None
        start = self.cache.host_lengths()[:B]
        runner = self.verify(B, T)
        runner.stage_inputs(last, generating, proposal)
        self.device_section(runner, proposal)
        rows = runner.read_back.read()                   # [B][2T]: the round's one host sync
        num_acc = [row[0] if g else 0 for row, g in zip(rows, generating)]
        self.cache.note_lengths([s + (1 + a if g else 0)
                                 for s, a, g in zip(start, num_acc, generating)])
        counts = proposal.counts if proposal is not None else [0] * B
        return RoundOutcome(
            committed=[row[1: a + 2] if g else [] for row, a, g in zip(rows, num_acc, generating)],
            num_accepted=num_acc,
            num_drafted=[c if g else 0 for c, g in zip(counts, generating)],
            drafts=[row[T + 1: T + 1 + c] for row, c in zip(rows, counts)])

    def device_section(self, runner: StaticVerify, proposal: Proposal | None) -> None:
        """Everything between staging and the read-back: queued device work only."""
        with self.section_guard():
            if proposal is not None and proposal.pending is not None:
                proposal.pending()                       # the draft graph
                proposal.pending = None
            if proposal is not None and runner.drafts_on_device(proposal):
                runner.take_drafts(proposal.tokens)
            runner.replay()                              # the verify graph
