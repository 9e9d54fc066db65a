"""The token-level engine: batches of prompts (token ids) in, committed token ids out, round by round.

It owns the target model, its static KV cache and the draft model's, and runs
prefill -> rounds (`specrt.engine.round`) until every row hits EOS or its token budget. It
knows nothing about text: stop strings, chat templates and printing live at the edges
(specrt.api), which may end a row early with `finish`.

One engine serves one generation at a time: `Engine.lock` serializes callers, and a generation
that is abandoned half-way (its iterator closed) releases the lock and leaves nothing behind,
because every generation starts by resetting the caches' lengths.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Iterator

from specrt.engine.metrics import RequestStats, Timing
from specrt.engine.round import prefill, run_round
from specrt.errors import CapacityError, ConfigError, SpecrtError
from specrt.model.graphs import StaticForward
from specrt.model.transformer import Transformer
from specrt.spec.config import SpecConfig
from specrt.spec.costs import CostModel
from specrt.spec.drafters.base import DraftContext, Proposal
from specrt.spec.planners import Planner, build_planner
from specrt.spec.sampling import SamplingParams, make_generator


@dataclasses.dataclass
class RoundEvent:
    """What one step of a generation committed. The prefill is round 0."""

    index: int
    new_tokens: list[list[int]]          # [B] tokens committed for each row (possibly empty)
    finished: list[bool]                 # [B] row is done (after this round)
    plan: str                            # "prefill", "plain", "draft_model:4", "ngram:3", ...
    draft_tokens: list[list[int]]        # [B] the drafts proposed this round
    num_accepted: list[int]              # [B]


class Generation:
    """Iterator over the RoundEvents of one batch. Rows may be ended early with `finish`."""

    def __init__(self, engine: "Engine", prompts: list[list[int]], max_new_tokens: int,
                 params: SamplingParams, planner: Planner | None, eos_ids: set[int]):
        self.engine = engine
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.params = params
        self.planner = planner
        self.eos_ids = eos_ids
        B = len(prompts)
        self.outputs: list[list[int]] = [[] for _ in range(B)]
        self.finished = [False] * B
        self.stats = [RequestStats() for _ in range(B)]
        self.timing = Timing()
        self._iter = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> RoundEvent:
        return next(self._iter)

    def close(self) -> None:
        self._iter.close()

    def finish(self, row: int, keep: int | None = None) -> None:
        """End `row` now, keeping only its first `keep` output tokens (default: all)."""
        if keep is not None:
            del self.outputs[row][keep:]
            self.stats[row].new_tokens = len(self.outputs[row])
        self.finished[row] = True

    def stats_dict(self, row: int) -> dict:
        k = self.planner.max_k if self.planner is not None else 0
        return self.stats[row].as_dict(self.timing, k)

    def _commit(self, row: int, tokens: list[int]) -> list[int]:
        """Append tokens to a row, cutting at EOS (kept) and at the token budget."""
        room = self.max_new_tokens - len(self.outputs[row])
        tokens = tokens[:room]
        for i, t in enumerate(tokens):
            if t in self.eos_ids:
                tokens = tokens[: i + 1]
                self.finished[row] = True
                break
        self.outputs[row] += tokens
        self.stats[row].new_tokens = len(self.outputs[row])
        if len(self.outputs[row]) >= self.max_new_tokens:
            self.finished[row] = True
        return tokens

    def _run(self) -> Iterator[RoundEvent]:
        eng = self.engine
        with eng.lock:
            t_start = time.perf_counter()
            try:
                yield from self._rounds(eng, t_start)
            finally:
                self.timing.total = time.perf_counter() - t_start

    def _rounds(self, eng: "Engine", t_start: float) -> Iterator[RoundEvent]:
        B = len(self.prompts)
        eng.cache.reset()
        gen = make_generator(self.params.seed, eng.target.device) if not self.params.greedy \
            else None
        if self.planner is not None:
            self.planner.begin(B)
            for drafter in self.planner.drafters:
                drafter.begin(B)

        t0 = time.perf_counter()
        first = prefill(eng.target, eng.cache, self.prompts, self.params, gen)
        self.timing.prefill += time.perf_counter() - t0
        new = [self._commit(b, [t]) for b, t in enumerate(first)]
        for st in self.stats:
            st.target_passes += 1
        self.timing.total = time.perf_counter() - t_start
        yield RoundEvent(0, new, list(self.finished), "prefill", [[] for _ in range(B)], [0] * B)

        index = 0
        static = eng.static_forward if eng.static else None
        while not all(self.finished):
            index += 1
            active = [not f for f in self.finished]
            histories = [p + o for p, o in zip(self.prompts, self.outputs)]
            ctx = DraftContext(histories, active, self.params, gen)
            r = run_round(eng.target, eng.cache, self.planner, ctx, static)
            self.timing.draft += r.draft_seconds
            self.timing.verify += r.verify_seconds
            new = []
            for b in range(B):
                if not active[b]:
                    new.append([])
                    continue
                self.stats[b].record_round(r.outcome.num_drafted[b], r.outcome.num_accepted[b],
                                           r.plan.label)
                new.append(self._commit(b, r.outcome.committed[b]))
            self.timing.total = time.perf_counter() - t_start
            yield RoundEvent(index, new, list(self.finished), r.plan.label,
                             _drafts_as_lists(r.proposal), r.outcome.num_accepted)


def _drafts_as_lists(proposal: Proposal | None) -> list[list[int]]:
    if proposal is None:
        return []
    return [row[:n] for row, n in zip(proposal.tokens.tolist(), proposal.counts)]


class Engine:
    def __init__(self, target: Transformer, draft: Transformer | None = None,
                 max_batch_size: int = 1, max_seq_len: int = 4096, static: bool = False):
        """static: run the verify pass and draft loop through static-buffer runners
        (specrt.model.graphs), captured as CUDA graphs on CUDA and run eagerly elsewhere."""
        if not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive integer, got {max_batch_size!r}")
        if not isinstance(max_seq_len, int) or max_seq_len < 2:
            raise ConfigError(f"max_seq_len must be an integer >= 2, got {max_seq_len!r}")
        self.target = target
        self.draft = draft
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.cache = target.new_cache(max_batch_size, max_seq_len)
        self.lock = threading.RLock()
        self.static = static
        self._forwards: dict[tuple[int, int], StaticForward] = {}
        self.draft_drafter = None
        if draft is not None:
            from specrt.spec.drafters.draft_model import DraftModelDrafter

            self.draft_drafter = DraftModelDrafter(draft, target.cfg.vocab_size, max_batch_size,
                                                   max_seq_len, static=static)

    def planner_for(self, spec: SpecConfig | None) -> Planner | None:
        return build_planner(spec, self.draft_drafter,
                             lambda k: CostModel.calibrate(self.target, self.draft, k))

    def static_forward(self, batch_size: int, t: int) -> StaticForward:
        """The target's static runner for [batch_size, t] inputs, built on first use."""
        runner = self._forwards.get((batch_size, t))
        if runner is None:
            runner = self._forwards[(batch_size, t)] = StaticForward(
                self.target, self.cache, batch_size, t, use_graph=True)
        return runner

    # --- generation -------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], max_new_tokens: int,
                 params: SamplingParams, spec: SpecConfig | None = None,
                 eos_ids=(), planner: Planner | None = None) -> Generation:
        """Start a generation over `prompts` (lists of token ids). Iterate the result for its
        RoundEvents; `outputs` and `stats_dict(row)` hold the results. `planner` overrides
        the one `spec` describes (custom drafters plug in here)."""
        self.check_request(prompts, max_new_tokens, spec)
        return Generation(self, [list(p) for p in prompts], max_new_tokens, params,
                          planner or self.planner_for(spec), set(eos_ids))

    def check_request(self, prompts: list[list[int]], max_new_tokens: int,
                      spec: SpecConfig | None) -> None:
        if not prompts:
            raise SpecrtError("no prompts given")
        if len(prompts) > self.max_batch_size:
            raise CapacityError(f"{len(prompts)} prompts exceed max_batch_size="
                                f"{self.max_batch_size}; raise max_batch_size or split the batch")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        vocab = self.target.cfg.vocab_size
        k = spec.num_speculative_tokens if spec is not None else 0
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise SpecrtError(f"prompt {i} is empty: give at least one token")
            bad = [t for t in p if not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise SpecrtError(f"prompt {i} has token id {bad[0]!r} outside the model's "
                                  f"vocabulary 0..{vocab - 1}")
            need = len(p) + max_new_tokens + (k + 1 if k else 0)
            if need > self.max_seq_len:
                raise CapacityError(
                    f"prompt {i} ({len(p)} tokens) + max_new_tokens ({max_new_tokens})"
                    + (f" + K+1 ({k + 1})" if k else "") + f" = {need} exceeds max_seq_len "
                    f"({self.max_seq_len}); raise max_seq_len or shorten the request")
