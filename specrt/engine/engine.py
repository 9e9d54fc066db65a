"""The token-level engine: requests (token ids) in, committed token ids out, round by round.

It owns the target model, its static KV cache, the draft model and its cache, and the
planners. Each request holds one slot (a cache row) from admission to its end: admission
prefills that row alone, then the request takes part in every round (`specrt.engine.round`)
with whatever other requests hold slots, until EOS, its token budget, or cancellation frees
the slot. New requests join at round boundaries (continuous batching). It knows nothing about
text, threads or queues: one owner drives it (`specrt.engine.scheduler`'s thread, or a test
calling `admit`/`step` directly).

Requests that speculate share one speculative config per batch (rows of one round share a
drafter and a planner); a request with another config waits until the speculating rows of the
running batch have finished. Requests without speculation join any batch and take plain
steps inside the same verify pass.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import time
from typing import Iterator

from specrt.engine.metrics import RequestStats, Timing
from specrt.engine.request import Request, Step, check_request, runs_alone
from specrt.engine.round import prefill_rows, run_round
from specrt.errors import CapacityError, ConfigError, SpecrtError
from specrt.engine.static_round import MAX_T, StaticRound
from specrt.model.graphs import GraphPool
from specrt.model.transformer import Transformer
from specrt.spec.config import (DRAFT_STOP, MAX_SPECULATIVE_TOKENS, SpecConfig,
                                check_draft_stop)
from specrt.spec.costs import CostModel
from specrt.spec.drafters.base import DraftContext
from specrt.spec.planners import Planner, build_planner
from specrt.spec.sampling import SamplingParams, make_generator

log = logging.getLogger("specrt.engine")
_GREEDY = SamplingParams()
MAX_PLANNERS = 8       # speculative configs whose planners an engine keeps (`planner_for`)


@dataclasses.dataclass(eq=False)
class _Row:
    """A request in its slot."""

    request: Request
    generator: object                    # torch.Generator | None (greedy)
    outputs: list[int] = dataclasses.field(default_factory=list)
    stats: RequestStats = dataclasses.field(default_factory=RequestStats)
    timing: Timing = dataclasses.field(default_factory=Timing)
    started: float = dataclasses.field(default_factory=time.perf_counter)
    rounds: int = 0

    @property
    def history(self) -> list[int]:
        return list(self.request.prompt) + self.outputs


class Engine:
    def __init__(self, target: Transformer, draft: Transformer | None = None,
                 max_batch_size: int = 1, max_seq_len: int = 4096, static: bool = False,
                 graph_max_k: int = MAX_SPECULATIVE_TOKENS, draft_stop: float = DRAFT_STOP):
        """static: run the verify pass and draft loop through static-buffer runners
        (specrt.engine.static_round), captured as CUDA graphs on CUDA -- all of them for
        K <= graph_max_k here, at load (`warm_up`) -- and run eagerly elsewhere.
        draft_stop: the draft model stops a row's drafting after a guess it gives less than
        this probability (0: never; not with static runners, which always draft K; see
        specrt.spec.drafters.draft_model). On the eager path no round drafts a guess past one
        that ends the answer or past what the budget has room for (`DraftContext.usable`)."""
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if not isinstance(max_seq_len, int) or max_seq_len < 2:
            raise ConfigError(f"max_seq_len must be an integer >= 2, got {max_seq_len!r}")
        draft_stop = check_draft_stop(draft_stop)
        for name, model in (("target", target), ("draft", draft)):
            if model is not None and max_seq_len > model.max_positions:
                raise ConfigError(f"max_seq_len {max_seq_len} is longer than the {name} model "
                                  f"was loaded for ({model.max_positions} positions); load it "
                                  f"with max_seq_len >= {max_seq_len}")
        self.target = target
        self.draft = draft
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        # slack: a verify pass computes K + 1 tokens on every row, padding included, a full
        # row's too; with room for them no pass falls back to other arithmetic
        self.cache = target.new_cache(max_batch_size, max_seq_len, slack=MAX_T)
        # every pass of a round (B (K + 1) rows at most) takes the same arithmetic
        for model in (target, draft):
            if model is not None:
                model.backend.plan_passes(max_batch_size * MAX_T)
        self.static = static
        pool = GraphPool(target.device) if static else None     # one pool for every graph
        self.graphs = StaticRound(target, self.cache, max_batch_size, pool) if static else None
        self.draft_drafter = None
        if draft is not None:
            from specrt.spec.drafters.draft_model import DraftModelDrafter

            self.draft_drafter = DraftModelDrafter(draft, target.cfg.vocab_size, max_batch_size,
                                                   max_seq_len, static=static, pool=pool,
                                                   stop_below=draft_stop)
        self.slots: list[_Row | None] = [None] * max_batch_size
        self._free = list(range(max_batch_size))     # a heap: the lowest free slot first
        self._spec_rows = 0                           # running requests that speculate
        # the newest MAX_PLANNERS configs' planners, least recently used first
        self._planners: collections.OrderedDict[SpecConfig, Planner] = collections.OrderedDict()
        self.planner: Planner | None = None      # the running batch's, while rows speculate
        self.batch_spec: SpecConfig | None = None
        self._reserved: list[int] = []           # slots admitted, waiting for their prefill
        if static and target.device.type == "cuda":
            self.warm_up(graph_max_k)

    # --- planners ---------------------------------------------------------------------------
    def planner_for(self, spec: SpecConfig | None) -> Planner | None:
        """The planner of `spec`, built on first use and kept for the next batch of that
        config; MAX_PLANNERS at most (a server's clients may send many configs): the least
        recently used one not serving the batch is dropped. Dropping loses nothing a request
        sees: a planner forgets its batch state at `new_batch`, and costs are cached apart."""
        if spec is None:
            return None
        if spec not in self._planners:
            self._planners[spec] = build_planner(spec, self.draft_drafter, self.cost_model)
            for old in [s for s, p in self._planners.items() if p is not self.planner]:
                if len(self._planners) <= MAX_PLANNERS:
                    break
                del self._planners[old]
        self._planners.move_to_end(spec)
        return self._planners[spec]

    def cost_model(self, max_k: int) -> CostModel:
        """The calibrated costs `auto` plans with (cached per machine and build), timed on the
        path this engine's rounds take (graphed or not). Call it on the thread that runs the
        rounds (`Scheduler.call`), as the planners do: timed from another thread they read
        slower than the rounds run."""
        return CostModel.calibrate(self.target, self.draft, max_k, graphed=self.static)

    def warm_up(self, max_k: int = MAX_SPECULATIVE_TOKENS) -> None:
        """Build every static runner a round can use -- verify passes for (B, T = 1..max_k + 1)
        and draft loops for (B, K = 1..max_k, catch-up 1 or 2), B = 1..max_batch_size, greedy
        and sampled -- and on CUDA capture their graphs, so no capture (and no allocation in
        the graph pool) lands mid-generation. Called at load when graphs are on CUDA."""
        t0 = time.perf_counter()
        sizes = range(1, self.max_batch_size + 1)
        self.graphs.capture_all(sizes, max_k)
        if self.draft_drafter is not None:
            self.draft_drafter.capture_all(sizes, max_k)
        log.info("static runners for K <= %d, B <= %d ready in %.1f s (%d graphs captured)",
                 max_k, self.max_batch_size, time.perf_counter() - t0,
                 self.graphs.pool.captured if self.graphs.pool is not None else 0)

    # --- admission ----------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return len(self._free) < self.max_batch_size

    @property
    def running(self) -> int:
        """Requests holding a slot (read from any thread: a length, never torn)."""
        return self.max_batch_size - len(self._free)

    def kv_positions(self) -> tuple[int, int]:
        """(positions of the target's cache holding running requests' tokens -- each one's
        prompt and what it has committed --, positions in all: max_batch_size x max_seq_len).
        Read from any thread: a snapshot of the slots, each length read whole."""
        used = sum(len(row.request.prompt) + len(row.outputs) for row in list(self.slots)
                   if row is not None)
        return used, self.max_batch_size * self.max_seq_len

    def can_admit(self, request: Request) -> bool:
        """A slot is free, the request's speculative config fits the running batch, and
        neither it nor a running request must run alone (`runs_alone`)."""
        if not self._free:
            return False
        if self.busy and (runs_alone(request) or any(
                row is not None and runs_alone(row.request) for row in self.slots)):
            return False
        return request.spec is None or self.batch_spec in (None, request.spec)

    def admit(self, request: Request, planner: Planner | None = None,
              queued: float = 0.0) -> Step:
        """Give `request` a slot and prefill it; returns its first step (which may already be
        its last). `planner` overrides the one its spec describes (custom drafters); `queued`:
        seconds it waited for a slot (for its stats)."""
        self.reserve(request, planner, queued)
        return self.prefill_reserved()[0]

    def reserve(self, request: Request, planner: Planner | None = None,
                queued: float = 0.0) -> int:
        """Check `request` and give it a slot; `prefill_reserved` must follow before the next
        `step`. Several reservations prefill together."""
        self.check(request)
        if not self.can_admit(request):
            raise CapacityError("no free slot for this request (or another speculative config "
                                "is running, or a seeded sampled `auto` request, which runs "
                                "alone); wait for a running request to finish")
        if request.spec is not None:
            if self.planner is None:
                self.planner = planner or self.planner_for(request.spec)
                self.planner.new_batch()
                # plain requests admitted while no planner was attached: the planner's
                # drafters keep state per row of the batch (n-gram indexes), theirs too
                running = [s for s, r in enumerate(self.slots) if r is not None]
                for drafter in self.planner.drafters:
                    drafter.reset(running)
            self.batch_spec = request.spec
        slot = heapq.heappop(self._free)
        self._spec_rows += request.spec is not None
        row = _Row(request, None if request.params.greedy
                   else make_generator(request.params.seed, self.target.device))
        row.timing.queued = queued
        self.slots[slot] = row
        self._reset_slot(slot)
        self._reserved.append(slot)
        return slot

    def prefill_reserved(self) -> list[Step]:
        """Prefill every reserved slot and choose each one's first token. Prompts short enough
        for the backend's batch-invariant passes share one pass; longer ones run alone, so a
        request's first token never depends on who else was admitted with it."""
        slots, self._reserved = self._reserved, []
        limit = self.target.backend.shared_prompt_tokens(self.target)
        together = [s for s in slots if len(self.slots[s].request.prompt) <= limit]
        groups = [together] if together else []
        alone = set(slots) - set(together)
        groups += [[s] for s in slots if s in alone]
        first: dict[int, int] = {}
        for group in groups:
            t0 = time.perf_counter()
            first.update(zip(group, self._prefill(group)))
            for s in group:
                self.slots[s].timing.prefill = time.perf_counter() - t0
        steps = []
        for slot in slots:
            row = self.slots[slot]
            row.stats.target_passes += 1
            if isinstance(first[slot], SpecrtError):      # this request alone fails
                step = self._finish(slot, row, [], "error")
                step.error = first[slot]
            else:
                step = self._step(slot, row, self._commit(row, [first[slot]]), "prefill", [], 0)
            step.scheduled = row.started
            steps.append(step)
        return steps

    def _prefill(self, group: list[int]) -> list[int | SpecrtError]:
        """The first tokens of `group`'s slots, prefilled in one pass over the cache rows they
        span (slots in between that are not in the group take no tokens), or the error that
        fails a slot's request (`prefill_rows`)."""
        lo, hi = min(group), max(group) + 1
        members = set(group)
        rows = [self.slots[s] if s in members else None for s in range(lo, hi)]
        return prefill_rows(self.target, self.cache.rows(lo, hi),
                            [list(r.request.prompt) if r else [] for r in rows],
                            [r.request.params if r else _GREEDY for r in rows],
                            [r.generator if r else None for r in rows], [s - lo for s in group])

    def _reset_slot(self, slot: int) -> None:
        self.cache.rows(slot, slot + 1).truncate([0])
        if self.draft_drafter is not None:
            self.draft_drafter.reset([slot])
        if self.planner is not None:
            self.planner.reset([slot])
            for drafter in self.planner.drafters:
                drafter.reset([slot])

    def cancel(self, request_id: str, reason: str = "cancelled") -> Step | None:
        """End a request now and free its slot; its last step, or None if it is not here."""
        for slot, row in enumerate(self.slots):
            if row is not None and row.request.request_id == request_id:
                return self._finish(slot, row, [], reason)
        return None

    def fail_all(self, error: BaseException) -> list[Step]:
        """A round failed: end every running request with the error, leaving clean slots."""
        steps = []
        for slot, row in enumerate(self.slots):
            if row is not None:
                step = self._finish(slot, row, [], "error")
                step.error = error
                steps.append(step)
        return steps

    def run(self, requests: list[Request], planner: Planner | None = None
            ) -> Iterator[list[Step]]:
        """Drive the engine from the calling thread (tests, benchmarks): admit `requests` as
        slots free up, then step until all have finished; yields each admission's and each
        round's steps. Not for use while a Scheduler owns this engine."""
        waiting = list(requests)
        while waiting or self.busy:
            while waiting and self.can_admit(waiting[0]):
                yield [self.admit(waiting.pop(0), planner)]
            if self.busy:
                yield self.step()

    # --- rounds -------------------------------------------------------------------------------
    def step(self) -> list[Step]:
        """One round over every running request; a Step for each of them."""
        if not self.busy:
            return []
        hi = max(s for s, r in enumerate(self.slots) if r is not None) + 1
        rows = self.slots[:hi]
        generating = [r is not None for r in rows]
        speculating = [r is not None and r.request.spec is not None for r in rows]
        ctx = DraftContext(
            histories=[r.history if r is not None else [] for r in rows],
            active=speculating if self.planner is not None else [False] * hi,
            params=[r.request.params if r is not None else _GREEDY for r in rows],
            generators=[r.generator if r is not None else None for r in rows],
            remaining=[r.request.max_new_tokens - len(r.outputs) if r is not None else 0
                       for r in rows],
            generated=[len(r.outputs) if r is not None else 0 for r in rows],
            ends=[r.request.eos_ids if r is not None else frozenset() for r in rows])
        result = run_round(self.target, self.cache, self.planner, ctx, generating, self.graphs)
        steps = []
        drafts = result.outcome.drafts
        for slot, row in enumerate(rows):
            if row is None:
                continue
            row.rounds += 1
            row.timing.draft += result.draft_seconds
            row.timing.verify += result.verify_seconds
            drafted, accepted = result.outcome.num_drafted[slot], result.outcome.num_accepted[slot]
            # a row with no drafts this round took a plain step, whatever the batch's plan
            label = result.plan.label if speculating[slot] and drafted else "plain"
            row.stats.record_round(drafted, accepted, label)
            new = self._commit(row, result.outcome.committed[slot])
            steps.append(self._step(slot, row, new, label, drafts[slot], accepted))
        return steps

    def _commit(self, row: _Row, tokens: list[int]) -> list[int]:
        """Append tokens to a row, cutting at EOS (kept) and at the token budget."""
        room = row.request.max_new_tokens - len(row.outputs)
        tokens = tokens[:room]
        for i, t in enumerate(tokens):
            if t in row.request.eos_ids:
                tokens = tokens[: i + 1]
                break
        row.outputs += tokens
        row.stats.new_tokens = len(row.outputs)
        return tokens

    def _step(self, slot: int, row: _Row, new: list[int], plan: str, drafts: list[int],
              accepted: int) -> Step:
        reason = None
        if new and new[-1] in row.request.eos_ids:
            reason = "eos"
        elif len(row.outputs) >= row.request.max_new_tokens:
            reason = "length"
        if reason is not None:
            return self._finish(slot, row, new, reason, plan, drafts, accepted)
        return Step(row.request.request_id, row.rounds, new, plan, drafts, accepted)

    def _finish(self, slot: int, row: _Row, new: list[int], reason: str, plan: str = "",
                drafts: list[int] | None = None, accepted: int = 0) -> Step:
        row.timing.total = time.perf_counter() - row.started
        max_k = self.batch_spec.num_speculative_tokens if row.request.spec is not None \
            and self.batch_spec is not None else 0
        stats = row.stats.as_dict(row.timing, max_k)
        self.slots[slot] = None
        heapq.heappush(self._free, slot)
        self._spec_rows -= row.request.spec is not None
        self._reset_slot(slot)        # the caches' row, and the drafters' history of it
        if not self._spec_rows:
            self.planner, self.batch_spec = None, None    # the next batch may speculate anew
        log.debug("%s finished (%s) after %d tokens", row.request.request_id, reason,
                  len(row.outputs))
        return Step(row.request.request_id, row.rounds, new, plan, drafts or [], accepted,
                    finish_reason=reason, stats=stats)

    def check(self, request: Request) -> None:
        """Raise SpecrtError naming the problem if `request` cannot run on this engine."""
        check_request(request, self.target.cfg.vocab_size, self.max_seq_len,
                      has_draft=self.draft is not None)

