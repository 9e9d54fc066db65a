"""Drafting with a small model that shares the target's tokenizer.

The draft model keeps its own static KV cache. `seen[b]` counts the committed tokens of row b
whose K/V are in that cache; each round it first catches up on the committed tokens it has not
seen (the whole prompt on the first round, then usually the target's last token, or two tokens
after a fully accepted round): that forward gives the first guess, and K - 1 decode steps the
rest, each fed the guess before it.
Rejected guesses are rolled back (by the round, through `rollback`) by truncating its cache
to the accepted length: O(1).

A row stops drafting early, below K, after a guess the draft model itself is unsure of
(`confidence` below `stop_below`, default DRAFT_STOP): its drafts run to that guess, and the
rows still sure go on (the eager path; the static loop drafts all K, a graph cannot stop on a
value it has not read back). The stop decides how many guesses are verified, never which
tokens are emitted: greedy output stays identical, and sampling stays exact (each guess is
still drawn from q, a recovered or bonus token from the target). Where a row stops depends on
its own logits only, and a row that stopped draws no more randomness, so a seeded request's
rounds are the same alone or in any batch. On the eager path a row also stops after a guess that
ends its answer, or at the last guess its budget has room for (`DraftContext.usable`: no later
guess could add a token), and a row with no room for any sits the round out. With a stop
it reports whether it was sure of each row's last guess (`Proposal.last_sure`), which `auto`
learns from.

With `static` (an engine with graphs) a round's proposal is one `StaticDraftLoop` replay:
catch-up (padded to 1 or 2 tokens; rows further behind feed all but their last token eagerly
first, on their own row) and the K guesses, staged through pinned memory, left on the device
for the verify graph (`propose_staged`). A round with a sampled row uses the loop's sampled
variant (each row's warp settings and noise staged; greedy rows beside it still take the
argmax).
"""
from __future__ import annotations

import torch

from specrt.model.config import ModelConfig
from specrt.model.transformer import Transformer
from specrt.spec.drafters.base import (LONG_CATCH_UP, NO_DRAFT, DraftContext, Proposal,
                                      right_pad)
from specrt.model.graphs import GraphPool
from specrt.spec.config import DRAFT_STOP, MAX_SPECULATIVE_TOKENS
from specrt.spec.drafters.draft_loop import CATCH_UP_WIDTHS, DraftScratch, StaticDraftLoop
from specrt.spec.sampling import choose_rows, confidence


SHORTLIST = 49152     # ids a draft scores by default in a vocabulary over twice as large ...
SHORTLIST_ALONE = 65536   # ... and one that reads no ids past them (a static drafter's)
UNREADABLE_AS = 0     # what a draft reads for a target id past its own vocabulary


def goes_on(sure: bool, ends_answer: bool, guesses: int, room: int) -> bool:
    """The stop of a row's round (eager path, `cut_short`): whether it drafts another guess
    after its `guesses`-th, which the draft was `sure` of (its `confidence` at least the
    stop) and which `ends_answer` or not. Not after one it is unsure of, one that ends the
    answer, or the last of the `room` its budget has (`DraftContext.room`)."""
    return sure and not ends_answer and guesses < room


def shortlist(vocab_size: int, special_ids, n="auto", reads_ids: bool = True
              ) -> list[int] | None:
    """The token ids a draft model scores: the first n ids plus the special ones (None: all).
    Byte-level BPE numbers its tokens in merge order, so the low ids are the frequent ones; the
    rare ones an answer needs are mostly names and words it repeats from its request, which the
    eager draft model scores too (`DraftModelDrafter._read_past_shortlist`). On the default
    pair the first 49,152 with those agree with the target's greedy token as often as the first
    65,536 alone did (teacher-forced on 64 recorded answers: 83.66% against 83.21%; the whole
    152k vocabulary 84.35%) and cut the draft's output head by 68% (benchmarks/RESULTS.md,
    "The draft scores what its request read"). A static drafter (CUDA graphs) reads no ids,
    and alone the first 49,152 agree less often (82.24%), so `reads_ids` False keeps the
    first 65,536. The target scores every token, so what is emitted does not change. n
    "auto": SHORTLIST (SHORTLIST_ALONE) when the vocabulary is over twice that."""
    if n == "auto":
        size = SHORTLIST if reads_ids else SHORTLIST_ALONE
        n = size if vocab_size > 2 * size else None
    if n is None or n >= vocab_size:
        return None
    return sorted(set(range(n)) | {t for t in special_ids if 0 <= t < vocab_size})


def draft_head_rows(cfg: ModelConfig, tokenizer=None, n="auto", reads_ids: bool = True
                    ) -> list[int] | None:
    """The rows a draft model with config `cfg` scores, as `LLM` loads it: the shortlist of n
    ids plus its EOS ids and the special ids of `tokenizer` (the target's, when it has one),
    so a draft can always propose a chat marker or the end of an answer; reads_ids: whether
    its drafter scores the ids its requests read (not a static one: `shortlist`). Benchmarks
    that load a draft themselves call this too, so they measure the model `LLM` runs."""
    specials = set(cfg.eos_token_ids)
    if tokenizer is not None:
        specials |= set(tokenizer.special_ids())
    return shortlist(cfg.vocab_size, specials, n, reads_ids)


def hide_unread(scores: torch.Tensor, text: list[int], ids, start: int = 0) -> torch.Tensor:
    """`scores` [N, V] of one pass over `text` (row j has read text[:start + j + 1]) with each
    id of `ids` at -inf in the rows before the first that has read it: what an eager draft that
    scores the ids its request has read past its shortlist (`DraftModelDrafter.past_shortlist`)
    gives at each position. Benchmarks that score a whole text at once call this. In place."""
    first = {}
    for i, t in enumerate(text):
        first.setdefault(t, i)
    for t in ids:
        scores[:max(first[t] - start, 0), t] = float("-inf")
    return scores


class DraftModelDrafter:
    name = "draft_model"

    def __init__(self, model: Transformer, target_vocab_size: int, max_batch_size: int,
                 max_seq_len: int, static: bool = False, pool: GraphPool | None = None,
                 stop_below: float = DRAFT_STOP):
        self.model = model
        # A row stops drafting after a guess whose `confidence` is below this (0: no stop on
        # it). A static drafter always drafts K, in its eager rounds too, so a request's
        # rounds do not depend on which path served them; nor does it stop at a guess that
        # ends the answer or at the row's budget (`cut_short`).
        self.stop_below = 0.0 if static else stop_below
        self.cut_short = not static
        # static: run proposals through a StaticDraftLoop (a CUDA graph on CUDA, in `pool`):
        # catch-up and all K guesses in one replay.
        self.static = static
        self.pool = pool
        self._loops: dict[tuple, StaticDraftLoop] = {}
        # Checkpoints pad their embeddings differently; a guess must be a token both can read,
        # and q must live on the target's vocabulary axis for the acceptance test.
        self.target_vocab_size = target_vocab_size
        self.common_vocab = min(model.cfg.vocab_size, target_vocab_size)
        self._scratch = DraftScratch(max_batch_size, MAX_SPECULATIVE_TOKENS, self.common_vocab,
                                     target_vocab_size, model.device) if static else None
        # slack: a static draft loop writes its catch-up and K - 1 guesses on every row
        self.cache = model.new_cache(max_batch_size, max_seq_len,
                                     slack=max(CATCH_UP_WIDTHS) + MAX_SPECULATIVE_TOKENS - 1)
        # A shortlisted draft also scores, per row, the ids past its shortlist that the row has
        # read (its prompt and answer so far: names and rare words an answer repeats), in the
        # eager path only, so a static drafter's rounds match on either path.
        self._shortlist = (set(model.head_rows.tolist())
                           if model.head_rows is not None and not static else None)
        self._read = [{} for _ in range(max_batch_size)]   # [B] ids past the shortlist read,
                                                            # in order (a dict's keys)
        self._scanned = [0] * max_batch_size   # committed tokens looked through for them
        self._scoring = [None] * max_batch_size   # [B] model.also_scoring of each row's _read
        self.seen = [0] * max_batch_size       # committed tokens whose K/V are cached, per row
        self._pending = [0] * max_batch_size   # committed tokens fed this round, per row
        self._guesses = [0] * max_batch_size   # guesses fed back this round, per row

    def reset(self, rows: list[int]) -> None:
        for r in rows:
            self.seen[r] = self._pending[r] = self._guesses[r] = self._scanned[r] = 0
            self._read[r], self._scoring[r] = {}, None
            self.cache.rows(r, r + 1).truncate([0])

    def lags(self, ctx: DraftContext) -> list[int]:
        """[B] committed tokens each active row has not fed the draft model: what the next
        proposal must catch up on before its first guess."""
        return [len(h) - s if a else 0 for h, s, a in zip(ctx.histories, self.seen, ctx.active)]

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Proposal | None:
        proposal = self.propose_staged(ctx, k)
        if proposal is not None and proposal.pending is not None:
            proposal.pending()
            proposal.pending = None
        return proposal

    @torch.inference_mode()
    def propose_staged(self, ctx: DraftContext, k: int) -> Proposal | None:
        """`propose`, except that on the static path the device work is left to the caller:
        the proposal's `pending` (the draft graph's replay) fills its tokens, so the round can
        run it beside the verify replay with no host sync between them."""
        if self.cut_short:    # a row whose budget has no room for a guess sits the round out
            ctx = ctx.with_room(k)
        pending = [h[s:] if a else [] for h, s, a in zip(ctx.histories, self.seen, ctx.active)]
        fed = [len(p) for p in pending]
        if max(fed) == 0:
            return None
        pending = self._catch_up_long_rows(self._readable(pending))
        B = len(fed)
        self._pending[:B] = fed
        sampled = any(a and not p.greedy for p, a in zip(ctx.params, ctx.active))
        loop = self._static_loop(B, k, pending, ctx.active, sampled) if self.static else None
        if loop is not None:
            advanced = loop.stage_inputs(pending, ctx.active, ctx.params, ctx.generators)
            self.cache.note_lengths([s + a for s, a in zip(self.cache.host_lengths(), advanced)])
            counts = [k if a else 0 for a in ctx.active]
            proposal = Proposal(tokens=loop.tokens, probs=loop.probs if sampled else None,
                                counts=counts, pending=loop.replay)
        else:
            tokens, qs, counts, last_sure = self._propose_eager(ctx, k, pending)
            proposal = Proposal(tokens=tokens, probs=self._draft_probs(qs), counts=counts,
                                last_sure=last_sure)
        # each row fed its guesses but the last (inactive rows in the static loop fed
        # garbage: their seen count stays put)
        self._guesses[:B] = [max(c - 1, 0) for c in counts]
        return proposal

    def _propose_eager(self, ctx: DraftContext, k: int, pending: list[list[int]]
                       ) -> tuple[torch.Tensor, list, list[int], list[bool | None] | None]:
        """(tokens [B, K'] NO_DRAFT-padded, q of each of the K' <= k steps, drafts per row,
        whether the draft was sure of each row's last guess (`Proposal.last_sure`)): each
        active row drafts until its k-th guess, or (`cut_short`) one below `stop_below`, one
        that ends its answer or the last its budget has room for (`DraftContext.usable`); the
        rows still drafting feed their last guess to the next step together (the last guess
        of a row is never fed: nothing would read its K/V), and a row that stopped neither
        computes nor draws any more."""
        device = self.model.device
        V = self.common_vocab
        also = self._read_past_shortlist(ctx)
        # Catch up on the unseen committed tokens; its last logits give the first guess.
        logits = self.model.forward(right_pad(pending).to(device), self.cache,
                                    num_valid=[len(p) for p in pending], last_only=True,
                                    also_score=also)
        drafting = list(ctx.active)                                  # [B] rows still drafting
        counts = [0] * len(drafting)                                 # [B] guesses per row
        guesses, qs = [], []                                         # [B] each, [B, V_common]
        judged = self.cut_short and self.stop_below > 0
        last_sure = [None] * len(drafting) if judged else None       # [B] of the last guess
        for i in range(k):
            if i:
                logits = self.model.forward(guesses[-1][:, None], self.cache,
                                            num_valid=[int(d) for d in drafting],
                                            also_score=also)
            step = logits[:, 0, :V]                                              # [B, V_c]
            guess, q = choose_rows(step, ctx.params, ctx.generators, drafting)
            guesses.append(guess)
            qs.append(q)
            counts = [c + d for c, d in zip(counts, drafting)]
            sure = (confidence(step) >= self.stop_below).tolist() if judged else None  # [B]
            if sure is not None:
                last_sure = [s if d else was for s, d, was in zip(sure, drafting, last_sure)]
            if i + 1 < k and self.cut_short:
                drafting = [d and g for d, g in zip(drafting, self._goes_on(ctx, sure, guess,
                                                                            counts, k))]
                if not any(drafting):
                    break
        tokens = torch.stack(guesses, dim=1)                                 # [B, K']
        past = torch.arange(tokens.shape[1], device=device)[None, :] \
            >= torch.tensor(counts, device=device)[:, None]                 # [B, K']
        return tokens.masked_fill_(past, NO_DRAFT), qs, counts, last_sure

    @property
    def reads_ids(self) -> bool:
        """Whether the draft scores, per row, the ids its row read past its shortlist."""
        return self._shortlist is not None

    def past_shortlist(self, ids, read: dict[int, None] | None = None) -> dict[int, None]:
        """`read` (default: a new one), an ordered set of ids (a dict's keys), extended in place
        by the ids of `ids` that the shortlist lacks and the draft can propose, in order of
        first use (none for a draft that reads none)."""
        read = {} if read is None else read
        if self.reads_ids:
            for t in ids:
                if t not in read and t not in self._shortlist and t < self.common_vocab:
                    read[t] = None
        return read

    def _read_past_shortlist(self, ctx: DraftContext) -> list | None:
        """[B] what the draft model scores, per active row, past its shortlist: the ids the row
        has read (committed) that the shortlist lacks and it can propose, in order of first use
        (`Transformer.also_scoring`, gathered again only when a row reads a new one); None for
        a draft that scores every id (or a static one). A row's depends on its own request."""
        if not self.reads_ids:
            return None
        for b, (h, a) in enumerate(zip(ctx.histories, ctx.active)):
            if a:
                read = self._read[b]
                before = len(read)
                self.past_shortlist(h[self._scanned[b]:], read)
                self._scanned[b] = len(h)
                if len(read) > before:
                    self._scoring[b] = self.model.also_scoring(list(read))
        return [self._scoring[b] if a else None for b, a in enumerate(ctx.active)]

    def _goes_on(self, ctx: DraftContext, sure: list[bool] | None, guess: torch.Tensor,
                 counts: list[int], k: int) -> list[bool]:
        """[B] whether each row drafts another guess after this step's (sure: [B] whether the
        draft was sure of each row's guess, None for a draft that never stops; guess: [B];
        `goes_on`)."""
        sure = [True] * len(counts) if sure is None else sure
        return [goes_on(s, ctx.ends_answer(b, t), n, ctx.room(b, k))
                for b, (s, n, t) in enumerate(zip(sure, counts, guess.tolist()))]

    def _readable(self, pending: list[list[int]]) -> list[list[int]]:
        """The draft reads ids below its own vocabulary size only; a target with more ids (a
        prompt id, or a token the target chose, in the gap) is fed UNREADABLE_AS instead. That
        only spoils the draft's guesses near it: the target verifies every guess."""
        V = self.model.cfg.vocab_size
        if V >= self.target_vocab_size:
            return pending
        return [[t if t < V else UNREADABLE_AS for t in p] for p in pending]

    def _catch_up_long_rows(self, pending: list[list[int]]) -> list[list[int]]:
        """Feed all but the last token of each long catch-up (a new request's prompt) on its
        own cache row, so the batched catch-up stays short and a row's draft numbers never
        depend on which rows share the batch."""
        out = []
        for b, p in enumerate(pending):
            if len(p) > LONG_CATCH_UP:
                ids = torch.tensor([p[:-1]], dtype=torch.int64, device=self.model.device)
                self.model.forward(ids, self.cache.rows(b, b + 1), last_only=True)
                p = p[-1:]
            out.append(p)
        return out

    def _draft_probs(self, qs: list[torch.Tensor | None]) -> torch.Tensor | None:
        """q of every guess on the target's vocabulary axis, [B, K, V_target]; None when every
        row is greedy (one-hot q)."""
        if all(q is None for q in qs):
            return None
        B = next(q for q in qs if q is not None).shape[0]
        full = [q if q is not None else torch.zeros(B, self.common_vocab, device=self.model.device)
                for q in qs]
        return torch.nn.functional.pad(torch.stack(full, dim=1),
                                       (0, self.target_vocab_size - self.common_vocab))

    def _static_loop(self, batch_size: int, k: int, pending: list[list[int]],
                     active: list[bool], sampled: bool) -> StaticDraftLoop | None:
        """The runner for this round, or None when some row's cache has no room for it (the
        eager path then serves the round: it writes only real tokens)."""
        width = max([len(p) for p, a in zip(pending, active) if a] + [1])
        if width not in CATCH_UP_WIDTHS:
            return None
        lengths = self.cache.host_lengths()[:batch_size]
        if max(lengths) + width + k - 1 > self.cache.capacity:
            return None
        return self.loop(batch_size, k, width, sampled)

    def loop(self, batch_size: int, k: int, catch_up: int, sampled: bool = False
             ) -> StaticDraftLoop:
        """The static runner for (batch_size, k, catch-up width, sampled), built on first use."""
        key = (batch_size, k, catch_up, sampled)
        loop = self._loops.get(key)
        if loop is None:
            loop = self._loops[key] = StaticDraftLoop(
                self.model, self.cache, batch_size, k, catch_up, self.common_vocab,
                use_graph=True, pool=self.pool, scratch=self._scratch if sampled else None)
        return loop

    def capture_all(self, batch_sizes, max_k: int) -> None:
        """Build and (on CUDA) capture the runner of every (B, K <= max_k, width, greedy or
        sampled) a round can use, so no capture lands mid-generation."""
        for B in batch_sizes:
            for k in range(1, max_k + 1):
                for width in CATCH_UP_WIDTHS:
                    for sampled in (False, True):
                        self.loop(B, k, width, sampled).capture()

    def rollback(self, num_accepted: list[int]) -> None:
        # Cached K/V stay valid for the pending tokens plus the accepted guesses that were fed.
        B = len(num_accepted)
        self.seen[:B] = [s + p + min(n, g) for s, p, g, n
                         in zip(self.seen, self._pending, self._guesses, num_accepted)]
        self.cache.truncate(self.seen[:B])
        self._pending[:B] = [0] * B
        self._guesses[:B] = [0] * B
