"""A speculative round on CUDA: two graph replays and one host sync.

The contract is `specrt.engine.round`'s; this is how an engine with graphs (`Engine(static=
True)`) carries it out:

  host      the planner chooses; the drafter stages its inputs (`propose_staged`: pinned
            buffer, non-blocking copy); the verify runner stages [last token, generating,
            drafts] the same way; in a round with a sampled row, each row's warp settings
            too, and each sampled row's randomness is drawn from its own generator into
            static device buffers (device work, no read), in the order the eager path draws it;
  device    (`StaticRound.device_section`) the draft graph replays (catch-up + K - 1 steps,
            `StaticDraftLoop`), its guesses (and their q, when sampling) are copied
            device-to-device into the verify runner's inputs, and the verify graph replays:
            the target's forward of K + 1 tokens, acceptance (greedy, and for sampled rows
            rejection sampling on the warped logits: `specrt.kernels.greedy_accept`,
            `rejection_sample`) and the rollback of the target cache's device lengths, leaving
            [B] accepted counts, [B, K + 1] tokens and the [B, K] drafts in one static buffer;
  host      one read-back of that buffer (`ReadBack.read`: the round's only sync), from which
            the committed tokens, the target cache's host lengths (`note_lengths`), the
            drafter's seen counts (its `rollback`) and the planner's observation all follow.

Nothing in the device section reads a device value on the host or builds a tensor from a
Python list (tests run it under a dispatch mode that fails on either). On the CPU the same
runners run their bodies eagerly, so CPU tests exercise this whole path, and check that a
seeded sampled request gets the tokens the eager path gives it.

A batch whose cache rows have no room for a static pass takes `round.verify_and_accept`'s
eager path (more syncs). Timing: on this path `draft_seconds` is only the staging; the draft
graph's GPU time lands in `verify_seconds`.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, ContextManager

import torch

from specrt.kernels import draw_randomness, fill_exponential_, greedy_accept, rejection_sample
from specrt.model.graphs import GraphPool, SharedScratch, StaticRunner
from specrt.model.kv_cache import StaticKVCache
from specrt.model.staging import ReadBack, Staging
from specrt.model.transformer import Transformer
from specrt.spec.config import MAX_SPECULATIVE_TOKENS
from specrt.spec.drafters.base import NO_DRAFT, DraftContext, Proposal
from specrt.spec.sampling import param_staging, race, stage_params, warp_rows

if TYPE_CHECKING:
    from specrt.engine.round import RoundOutcome

MAX_T = MAX_SPECULATIVE_TOKENS + 1      # the widest verify pass: K_max drafts + the last token


class StaticVerify(StaticRunner):
    """Staged [last, generating, drafts] [B, T + 1] -> target forward of T = K + 1 tokens,
    acceptance and the target cache's rollback, all on the device. `result` [B, 2T] holds per
    row: accepted count, the K + 1 output tokens (-1 after the committed ones), the K drafts.

    Greedy acceptance for every row; in a sampled runner (`sampled`), a sampled row's outcome
    is rejection sampling instead: p = `warp_rows` of the logits with the row's staged settings,
    q its drafts' distribution (`probs`: the draft model's, or one-hot for deterministic
    drafts), and the uniforms and noise its generator drew before the replay (`draw`)."""

    def __init__(self, model: Transformer, cache: StaticKVCache, batch_size: int, t: int,
                 logits: torch.Tensor, pool: GraphPool | None,
                 scratch: "VerifyScratch | None" = None):
        super().__init__(model, cache, True, pool)
        device = model.device
        # columns: the last committed token, generating (0/1), then the K drafts (NO_DRAFT pads)
        self.stage = Staging((batch_size, t + 1), torch.int64, device)          # [B, T + 1]
        self.ids = torch.zeros(batch_size, t, dtype=torch.int64, device=device)  # [B, T]
        self.start = torch.zeros(batch_size, dtype=torch.int64, device=device)   # [B]
        self.logits = logits[:batch_size, :t]        # [B, T, V] view of the round's buffer
        self.result = torch.zeros(batch_size, 2 * t, dtype=torch.int64, device=device)
        self.read_back = ReadBack(self.result)                                    # [B, 2T]
        self.sampled = scratch is not None
        if scratch is not None:
            self.params = param_staging(batch_size, device)  # [B, 4] staged warp settings
            self.probs, self.uniforms, self.noise = scratch.views(batch_size, t - 1)
            # [B, K, V], [B, K], [B, V]

    def describe(self) -> str:
        B, T = self.ids.shape
        kind = ", sampled" if self.sampled else ""
        return f"StaticVerify(B={B}, T={T}{kind})"

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
        if self.sampled:
            rows = self.params.device                                            # [B, 4]
            p = warp_rows(self.logits, rows)                                     # [B, T, V]
            if T == 1:       # a plain step: the draw of `choose_rows`
                n_s = torch.zeros_like(n)
                out_s = race(p[:, 0], self.noise)[:, None]                        # [B, 1]
            else:
                n_s, out_s = rejection_sample(p, self.probs, drafts, self.uniforms, self.noise)
            pick = rows[:, 3] > 0                                                # [B]
            n = torch.where(pick, n_s.to(torch.int64), n)
            out = torch.where(pick[:, None], out_s, out)
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

    def draw(self, ctx: DraftContext, generating: list[bool], counts: list[int],
             k_plan: int) -> None:
        """Stage each row's warp settings, and draw each generating sampled row's randomness
        from its generator as the eager acceptance does (`round._accept`): uniforms for the
        planned K then Exp(1) noise when it has drafts, the noise of a plain draw when not."""
        B, T = self.ids.shape
        V, device = self.logits.shape[-1], self.logits.device
        stage_params(self.params, ctx.params[:B], V)
        for b in range(B):
            if not generating[b] or ctx.params[b].greedy:
                continue
            gen = ctx.generators[b]
            if counts[b]:
                uniforms, noise = draw_randomness(1, max(k_plan, T - 1), V, gen, device)
                self.uniforms[b].copy_(uniforms[0, : T - 1])
                self.noise[b].copy_(noise[0])
            else:
                fill_exponential_(self.noise[b], gen)

    def take_probs(self, proposal: Proposal | None) -> None:
        """q of the drafts, on the device: the drafter's (a copy), or one-hot for drafts with
        none (n-gram, greedy drafting), which rejection sampling treats as `probs=None`."""
        if proposal is not None and proposal.probs is not None:
            self.probs.copy_(proposal.probs)
            return
        drafts = self.stage.device[:, 2:]                                        # [B, K]
        self.probs.zero_().scatter_(2, drafts.clamp(min=0).unsqueeze(-1), 1.0)

    def drafts_on_device(self, proposal: Proposal) -> bool:
        return proposal.tokens.device == self.ids.device

    def take_drafts(self, tokens: torch.Tensor) -> None:  # [B, K] on the device
        self.stage.device[:, 2:].copy_(tokens)


class VerifyScratch:
    """q, uniforms and noise of the sampled verify runners, shared by all of them (they replay
    one at a time, each after its inputs are written)."""

    def __init__(self, max_batch_size: int, vocab: int, device: torch.device):
        rows = max_batch_size * (MAX_T - 1)
        self.vocab = vocab
        self._probs = SharedScratch(rows * vocab, 0.0, device)
        self._uniforms = SharedScratch(rows, 0.0, device)
        self._noise = SharedScratch(max_batch_size * vocab, 1.0, device)

    def views(self, batch_size: int, k: int):   # [B, K, V], [B, K], [B, V]
        V = self.vocab
        return (self._probs.view(batch_size, k, V), self._uniforms.view(batch_size, k),
                self._noise.view(batch_size, V))


class StaticRound:
    """The verify runners of an engine with graphs, the shared buffers they write, and the
    round's host part (`run`)."""

    def __init__(self, target: Transformer, cache: StaticKVCache, max_batch_size: int,
                 pool: GraphPool):
        self.target, self.cache, self.pool = target, cache, pool
        V = target.cfg.vocab_size
        # One logits buffer for every runner: graphs replay one at a time, and nothing reads it
        # after the round's read-back.
        self.logits = torch.zeros(max_batch_size, MAX_T, V, dtype=torch.float32,
                                  device=target.device)                          # [Bmax, T, V]
        self.scratch = VerifyScratch(max_batch_size, V, target.device)
        self._verify: dict[tuple[int, int, bool], StaticVerify] = {}
        # Entered around every device section: tests put a no-sync checker here.
        self.section_guard: Callable[[], ContextManager] = contextlib.nullcontext

    def verify(self, batch_size: int, t: int, sampled: bool = False) -> StaticVerify:
        """The verify runner for [batch_size, t] passes (greedy or sampled), built on first
        use."""
        key = (batch_size, t, sampled)
        runner = self._verify.get(key)
        if runner is None:
            runner = self._verify[key] = StaticVerify(
                self.target, self.cache, batch_size, t, self.logits, self.pool,
                self.scratch if sampled else None)
        return runner

    def capture_all(self, batch_sizes, max_k: int) -> None:
        """Build and (on CUDA) capture the runner of every (B, T = 1..max_k + 1), greedy and
        sampled."""
        for B in batch_sizes:
            for t in range(1, max_k + 2):
                for sampled in (False, True):
                    self.verify(B, t, sampled).capture()

    def runners(self) -> list[StaticVerify]:
        return list(self._verify.values())

    @property
    def read_backs(self) -> int:
        """Host syncs of static rounds so far (one per round)."""
        return sum(r.read_back.count for r in self._verify.values())

    def fits(self, batch_size: int, t: int) -> bool:
        """A static pass writes t positions on every row of the batch: is there room? (Always,
        for t <= MAX_T, in an engine's cache: it has MAX_T positions of slack.)"""
        return t <= MAX_T and max(self.cache.host_lengths()[:batch_size]) + t <= \
            self.cache.capacity

    def run(self, last: list[int], generating: list[bool], proposal: Proposal | None,
            ctx: DraftContext, k_plan: int) -> "RoundOutcome | None":
        """The round's verify, acceptance and target rollback with one host sync; None when
        some row's cache has no room for a static pass (nothing was run)."""
        from specrt.engine.round import RoundOutcome

        B, T = len(last), (proposal.k if proposal is not None else 0) + 1
        if not self.fits(B, T):
            return None
        counts = proposal.counts if proposal is not None else [0] * B
        sampled = any(g and not p.greedy for g, p in zip(generating, ctx.params))
        start = self.cache.host_lengths()[:B]
        runner = self.verify(B, T, sampled)
        runner.stage_inputs(last, generating, proposal)
        if sampled:
            runner.draw(ctx, generating, counts, k_plan)
        self.device_section(runner, proposal)
        rows = runner.read_back.read()                   # [B][2T]: the round's one host sync
        num_acc = [row[0] if g else 0 for row, g in zip(rows, generating)]
        self.cache.note_lengths([s + (1 + a if g else 0)
                                 for s, a, g in zip(start, num_acc, generating)])
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
            if runner.sampled and runner.ids.shape[1] > 1:
                runner.take_probs(proposal)
            runner.replay()                              # the verify graph
