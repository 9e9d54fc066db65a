"""Adaptive speculation (method "auto"): choose the drafter and K every round.

Each round the planner scores every option by expected committed tokens per second,

    value(drafter, K) = E / (c_first + (K - 1) * c_draft + c_verify(K + 1) + c_lump * E / H),
    E = E[tokens | K, a] = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_K,

(a draft model that stops after a guess it is unsure of: its drafted guesses and E as it
runs, `_draft_round`), where a_i is the acceptance probability of draft position i given the
earlier ones were accepted, c_first the draft model's batched first forward of the round over
the one or two committed tokens each row has not fed it, and c_lump the catch-up of rows
further behind (a new request's prompt, or the tokens of plain rounds), a one-off price spread
over the H tokens the rows are expected to still commit with the draft model: as many as they
have committed so far (at least MIN_HORIZON, at most their budget and HORIZON), times the share
of the rounds it would be drafting in (`_draft_share`).
K = 0 is a plain decoding step (value 1 / c_verify(1)). A row is priced for no more guesses than
could add a token (`DraftContext.usable`: none past an end id, at most one fewer than the tokens
its budget has left), as the eager drafters draft it (a static draft loop drafts K on every row,
and is priced so). Options:
- the n-gram drafter, whenever its index has a match (its guesses are free: c_draft = 0,
  and K is at most the number of tokens the match offers). Its acceptance is kept per matched
  length n ("ngram/n"): a guess that follows a 3-token match is right far more often than one
  after a 1-token match, and one average would overrate the second and underrate the first. A
  match grows by each guess accepted, so guess i of a match of n tokens, reached only if the
  i - 1 before it were right, follows a match of n + i - 1 tokens: it is weighed, and learnt,
  as the first guess of that longer match (`_ngram_weighed`, `_learn_match`), and each state
  keeps one acceptance, learnt from every guess it sees. A match whose text has agreed with its
  source for COPYING tokens or more is a copy in progress ("ngram/copy"), which goes on until
  the text departs from its source, as likely at one position as at the next (per-guess weight
  COPY_WEIGHT). So a passage being rewritten, whose 1- and 2-token matches lengthen into a copy
  round by round, is drafted long as soon as its matches are, instead of K creeping up one
  position at a time;
- the draft model, K = 1..K_max, run only when it wins. K is the most it drafts: the eager
  one stops a row's round after a guess it is unsure of (`draft_stop`), so a round is priced
  as it runs (GOES): a run of guesses it was sure of, accepted at the per-position estimates
  (learnt from those guesses only), ended by one it was unsure of (accepted at UNSURE's
  estimate) or by K; a K past its sure stretches costs little. A round whose sure drafts
  were all accepted, however few, lifts the positions past it as any other does. A static
  loop drafts K on every round, priced so, its estimates of every guess.

a_i is estimated per request (per row), as an exponentially weighted average with a prior:
the draft model's per position, weighed pooled with the positions before it (`pooled`), prompt
lookup's per matched length (above). Costs come from a calibration at first use
(specrt.spec.costs), cached per machine and build, and nothing else: a plan is a function of
the batch's histories and the calibrated costs, never of how long this run's rounds took, so
two identical requests run alone (or beside identical companions) get the same plans (and a
seeded sampled request the same output) however busy the machine is; in a mixed batch the
plan, and so a sampled request's random stream, depends on the others (so a seeded sampled
request runs alone: specrt.engine.request.runs_alone).
A busier machine slows drafting and verifying alike, which moves no choice; the ratio between
them is what the calibration measured. Costs are for the round's whole batch, priced by the
tokens each row really computes (rows are packed: a row without guesses scores one token; past
the backend's batch-invariant pass size each chunk streams the weights again): with more
requests in flight, drafting K more tokens per row costs more, so a busy batch drafts less,
and a match of one row among four is cheap to verify. The choice depends only on past rounds,
never on the current round's outcome, so greedy output stays identical and sampling stays
exact.

An estimate below break-even keeps its drafter out, and so is never tested by the rounds
that would correct it: each round the draft model sits out, its estimates below the request's
own mean acceptance move `RELAX` of the way back up to it (`_relax`), so a bad stretch of text
is not held against the draft model for the rest of the answer, while one wrong all along
stays out (its mean falls with it). A stopping draft's share of sure guesses and their
acceptance below their priors relax the same way, up to the priors.

Until the draft model has drafted for a row, what the row's plain steps tell of the text
stands in for its guesses: each plain step of a greedy row reports how sure the target was of
its token (its `confidence`, `Plan.wants_sure`), and the draft's guess is the target's token
about as often as the target is sure of it. A mean of those (weighed as the draft's acceptance
is, the prior counted PRIOR_COUNT times) above the prior lifts the draft model's estimates to
it, so text the target writes surely (an edit of pasted code) buys the draft's catch-up as soon
as it pays; one below leaves the prior (`_hear_target`). Eager rounds only: an engine with CUDA
graphs reads nothing back for it, and plans from the prior.

A drafter that lost is probed again with K = 1 in the `PROBE_BASE`-th round since it last
drafted, the gap doubling after each probe until it wins a round on merit, so a text that
turns predictable is noticed without paying much for a drafter that does not pay. Prompt
lookup keeps a gap per matched length: a length that lost is probed while others win. A
probe runs only if the drafter could win at all: accepted at OPTIMISTIC, it would beat a
plain step at the round's costs (in a busy batch the draft model's catch-up and the wider
verify pass rarely can), and never where the draft model would first have to catch up on
more than a plain step costs (a prompt it has not read): that is bought on merit or not at
all.
"""
from __future__ import annotations

import dataclasses
import math

from specrt.spec.costs import CostModel
from specrt.spec.drafters.base import (LONG_CATCH_UP, CatchUpDrafter, DraftContext,
                                      MatchingDrafter)
from specrt.spec.drafters.ngram import COPYING
from specrt.spec.planners.base import PLAIN, Plan

COPY_STATE = "ngram/copy"
# Acceptance before a request's first round, per state. The draft model's: its per-prompt
# agreement with the target is 0.58-1.0 on the recorded traces (mean 0.83). 0.65 was chosen on
# four calibrations of one build (benchmarks/RESULTS.md, "The draft model's prior"). On one timed
# in a burst of fast memory (a ~55 ms target step where ~86 ms is usual here) a verify pass
# costs more steps, buying the draft's read of a prompt needs ~0.75 acceptance, and at 0.65
# `auto` decoded most code plain (replayed: 84-89% of the best fixed setting, against 97%).
# 0.75, with a round that prompt lookup copied not counted as one the draft model would win
# (`observe`), replayed on 64 prompts at 64 tokens: 93-95% on three fast-memory calibrations and
# 97.2-99.0% on eight slow ones (no calibration's mean and no set's fell; at 128 tokens two
# sets' fell 0.2 points). Its lowest prompt fell, a 10-token answer after a 132-token prompt,
# whose draft it buys and does not repay: 0.734 -> 0.702 (benchmarks/RESULTS.md, "A fast-memory
# calibration, the draft's prior, and copied rounds").
# That prior is now of a draft model that drafts K every round (a static loop). One that stops
# after a guess it is unsure of (the eager one, `_stops`) has estimates of the guesses it was
# sure of, 93% right on the traces (below): "draft_model/sure". Replayed (64 prompts, 11
# calibrations, 64 tokens), 0.75 / 0.8 / 0.85 / 0.9 gave means of 98.6 / 99.3 / 99.8 / 99.7%
# of the best fixed setting on the eight slow-memory calibrations and 95.9 / 96.4 / 96.6 /
# 97.3% on the three fast ones, the lowest prompts 0.70 / 0.71 / 0.68 / 0.64 (mean over the
# calibrations): 0.85.
PRIORS = {"draft_model": 0.75, "draft_model/sure": 0.85, "ngram/1": 0.3, "ngram/2": 0.4,
          "ngram": 0.5, COPY_STATE: 0.8}           # "ngram": n = 3-7
# The eager draft model drafts on after a guess it is sure of and stops after one it is not
# (`draft_stop`). Teacher-forced over the 64 recorded answers (7,095 positions, draft_stop 0.5),
# it was sure of 84% of its guesses, and 93% of those were the target's token against 41% of the
# others. So a round is priced as what it is: a run of sure guesses, each accepted at the
# per-position estimate (learnt from sure guesses only), ended by an unsure one accepted at
# UNSURE, or by K. A K past the text's sure stretches costs little, as the draft stops first;
# priced as if every round drafted K, one whose guesses were often unsure looked too dear to
# draft far, and stories and explanations drafted K = 3 where K = 5-6 paid (benchmarks/
# RESULTS.md, "`auto` prices the draft's stop"). Per row, learnt as the draft's estimates are,
# from these priors (measured, not tuned).
GOES = 0.84                   # prior: the share of guesses the draft is sure of
UNSURE = 0.41                 # prior: how often a guess it is unsure of is accepted
# EWMA weight of the newest observation of a position: an average over ~12 rounds. At 0.3
# (~6 rounds) a draft model accepted 63% of the time read below its break-even after two
# rejections in a row, sat out, and was only probed back later; summed calibrated costs over
# 7 e2e prompts put auto at 93-95% of the best fixed method on prose with 0.3, 97-99% with 0.15.
WEIGHT = 0.15
# Prompt lookup is either copying (nearly every guess right) or not, and switches between the
# two within a few tokens: its states learn faster (per guess), or a copied paragraph is half
# over before auto drafts it in long runs (held-out rewrite prompts: K ramped 1, 2, ... 10 over
# ~20 rounds). Replayed, 0.25 and 0.5 were within 0.3 points of it (benchmarks/RESULTS.md, "A
# match grows by each guess accepted").
NGRAM_WEIGHT = 0.35
# The copy state's: ~10 guesses of memory, about one copied clause (0.05 and 0.2: within 0.3
# points, as above).
COPY_WEIGHT = 0.1
# The prior counts as this many observations: a state's first outcomes weigh 1/3, 1/4, ...
# (the mean of the prior and what was seen) until that falls to its EWMA weight. At the EWMA
# weight alone a request's first rounds barely moved off the prior: a code answer whose drafts
# were mostly right drafted K = 2, 2, 2, 2, 3, 2, 3, 4, 3, ... for 20 rounds, as long as a
# 64-token answer runs. Replayed on the recorded traces cut to 64 tokens, auto's mean share of
# the best fixed setting rose from 93.0% to 95.2% (3: 95.0%), on all 128 from 94.6% to 95.7%
# (benchmarks/RESULTS.md, "Calibrated on the wrong thread, and auto learns ...").
PRIOR_COUNT = 2
SPREAD = 0.5                  # pull of a fully accepted round on the positions past it
# Each round the draft model sits out, its estimates below the request's mean acceptance (all
# its guesses so far, the prior counted PRIOR_COUNT times) move this share of the way up to it.
# A story whose draft model fell to a_1 = 0.27 in a bad stretch sat out 34 of 63 rounds, probed
# once (rejected), where K = 3 throughout was 1.28x plain. Replayed on 64 prompts at 64 and
# 128 tokens on five calibrations (640 replays), auto's mean share of the best fixed setting
# rose from 96.83% to 97.04%, replays at >= 95% from 443 to 449, and no calibration's mean
# fell (0.03: 96.97%, 0.1: 97.05%; relaxing down too, or the n-gram states too, measured worse;
# benchmarks/RESULTS.md, "A sidelined draft model's estimates relax ...").
RELAX = 0.05
PROBE_BASE = 16
PROBE_MAX = 512
# A drafter is probed only if, accepted this often, it would beat a plain step at the round's
# costs: on predictable text good drafts reach ~0.9 (benchmarks/RESULTS.md).
OPTIMISTIC = 0.9
HORIZON = 256                 # at most this many future tokens amortize a draft catch-up
# ... and at least this many: an answer that has just started is expected to go on this long.
MIN_HORIZON = 16
# A catch-up lump is a sure cost paid now, for savings that come only if the answer runs on
# and the draft model keeps winning rounds: it is priced this much above its time. Unpriced, a
# purchase that won its round by a hair staked several plain steps on almost nothing: on a
# calibration where the target's 4-token pass cost 0.94 of the one before (Zen 4, 3-6-token
# passes on the tiled kernel), a 252-token rewrite and a 259-token document question bought the
# draft's read of the prompt in their first rounds, where prompt lookup was about to copy:
# 0.77x and 0.78x their time without it. A premium on the lump itself weighs a small catch-up
# (a few plain rounds) and one row's prompt in a batch only by their share of the round's
# price. Replayed (64 prompts, 64 and 128 tokens, eight calibrations of two builds), 0.1 raised
# auto's mean share of the best fixed setting on 15 of the 16 replays (+0.2 to +1.0 points) and
# tied 1; one lowest prompt fell, 0.751 -> 0.745 (0.05: smaller gains; 0.15 and 0.2: lower means
# and lowest prompts on several). On three timed while memory ran fast, where buying the draft
# model is marginal, the mean fell 0.4 to 2.5 points (benchmarks/RESULTS.md, "Zen 4: narrow
# verify passes tiled; a premium on the draft's catch-up").
LUMP_PREMIUM = 0.1


@dataclasses.dataclass
class DrafterState:
    name: str                     # "draft_model", "ngram/n" for matches of n tokens, or
                                  # "ngram/copy" for a copy in progress (n >= COPYING)
    drafter: str                  # the drafter it belongs to
    alphas: list[list[float]]     # [B][K_max] acceptance per position, per row (an n-gram
                                  # state: [B][1], one acceptance for every position)
    seen: list[list[int]] = dataclasses.field(default_factory=list)   # outcomes observed per
                                  # position, shaped as alphas
    tally: list[list[int]] = dataclasses.field(default_factory=list)  # [B][2] guesses
                                  # accepted and guesses observed, over the row's request
                                  # (the draft model's, which `_relax` reads; an n-gram
                                  # state's stays [0, 0])
    idle_rounds: int = 0          # rounds since this drafter last proposed
    probe_gap: int = PROBE_BASE


@dataclasses.dataclass(frozen=True)
class Decision:
    """Why a plan was chosen, handed back to `observe` with it."""

    feeds: tuple[str | None, ...]   # [B] the state each row's outcome updates (None: none;
                                    # an n-gram round's: its first guess's, the later ones
                                    # learn in the states of the longer matches they follow)
    probe: str | None = None        # the state probed, if not a choice on merit
    draft_won: tuple[bool | None, ...] = ()   # [B] whether the draft model, caught up, would
                                    # have won the round (None: the row sat it out; (): no
                                    # draft model)
    lengths: tuple[int, ...] = ()   # [B] each row's matched length (an n-gram plan)
    rooms: tuple[int, ...] = ()     # [B] the guesses each row had room for (a draft-model plan)


def expected_tokens(alphas: list[float], k: int, go: float = 1.0, unsure: float = 0.0
                    ) -> float:
    """1 + a1 + a1 a2 + ... (k terms): tokens a round commits on average. For a draft that
    stops after a guess it is unsure of (`AdaptivePlanner._draft_round`), guess i is drafted
    only if it was sure of the i - 1 before it (each with share `go`), and accepted at a_i if
    sure, at `unsure` if not: 1 + sum_i (go a_1 ... go a_{i-1}) (go a_i + (1 - go) unsure)."""
    total, run = 1.0, 1.0
    for a in alphas[:k]:
        total += run * (go * a + (1.0 - go) * unsure)
        run *= go * a
    return total


def pooled(alphas: list[float]) -> list[float]:
    """The draft model's per-position estimates as the planner weighs them: a_1 as learnt,
    and a_i (i >= 2) the mean of a_2 .. a_i. A later position is observed in fewer rounds, so
    its own estimate is noisy: one rejection at position 3 would cut K below 3 for a dozen
    rounds. Given the guesses before it were right, a guess is about as likely right at one
    position as at the next (burst-y text: more likely), so pooling costs little bias
    (replayed traces, benchmarks/RESULTS.md "auto replayed")."""
    out, total = list(alphas[:1]), 0.0
    for i, a in enumerate(alphas[1:], 1):
        total += a
        out.append(total / i)
    return out


class AdaptivePlanner:
    """method "auto": built from explicit parts, the calibrated costs and the drafters it may
    use (a draft model, a prompt-lookup drafter, or both)."""

    priors = PRIORS               # acceptance before a request's first round, per state
    goes_prior = GOES             # ... and the draft's share of sure guesses (a draft that
    unsure_prior = UNSURE         # stops), and its unsure guesses' acceptance

    def __init__(self, max_k: int, costs: CostModel, draft_model: CatchUpDrafter | None = None,
                 ngram: MatchingDrafter | None = None):
        self.max_k = max_k
        self.costs = costs
        self.draft_model = draft_model
        self.ngram = ngram
        self.drafters = tuple(d for d in (draft_model, ngram) if d is not None)
        self.states: dict[str, DrafterState] = {}
        self.rounds: list[int] = []       # [B] rounds planned for the row's request
        self.draft_wins: list[int] = []   # [B] ... that the draft model, caught up, would win
                                          # and prompt lookup did not copy (`observe`)
        self.target_sure: list[float] = []   # [B] the mean `confidence` of the target's plain
        self.sure_seen: list[int] = []       # steps (`_hear_target`), and how many it heard
        self.draft_rounds: list[int] = []    # [B] rounds the draft model drafted for the row
        self.goes: list[float] = []          # [B] the share of the draft's guesses it was sure
        self.goes_seen: list[int] = []       # of (GOES), and how many it saw
        self.unsure: list[float] = []        # [B] acceptance of the guesses it was unsure of
        self.unsure_seen: list[int] = []     # (UNSURE), and how many it saw

    # --- planner protocol -------------------------------------------------------------------
    def new_batch(self) -> None:
        """A batch starts with no other request running: forget every row and probe."""
        self.states = {}
        self.rounds, self.draft_wins = [], []
        self.target_sure, self.sure_seen = [], []
        self.goes, self.goes_seen, self.unsure, self.unsure_seen = [], [], [], []
        self.draft_rounds = []

    def reset(self, rows: list[int]) -> None:
        if not self.states:
            names = [("draft_model", "draft_model")] if self.draft_model is not None else []
            if self.ngram is not None:
                lengths = [*range(self.ngram.min_n, COPYING), COPYING]
                names += [(name, "ngram") for name in dict.fromkeys(map(self._ngram_state,
                                                                          lengths))]
            self.states = {name: DrafterState(name, drafter, []) for name, drafter in names}
        for state in self.states.values():
            prior = (self._draft_prior() if state.drafter == "draft_model"
                     else self.priors.get(state.name, self.priors[state.drafter]))
            width = self.max_k if state.drafter == "draft_model" else 1
            while len(state.alphas) <= max(rows, default=-1):
                state.alphas.append([prior] * width)
                state.seen.append([0] * width)
                state.tally.append([0, 0])
            for r in rows:
                state.alphas[r] = [prior] * width
                state.seen[r] = [0] * width
                state.tally[r] = [0, 0]
        prior = self.priors["draft_model"]
        while len(self.rounds) <= max(rows, default=-1):
            for per_row in (self.rounds, self.draft_wins, self.sure_seen, self.goes_seen,
                            self.unsure_seen, self.draft_rounds):
                per_row.append(0)
            self.target_sure.append(prior)
            self.goes.append(self.goes_prior)
            self.unsure.append(self.unsure_prior)
        for r in rows:
            self.rounds[r] = self.draft_wins[r] = self.sure_seen[r] = 0
            self.goes_seen[r] = self.unsure_seen[r] = self.draft_rounds[r] = 0
            self.target_sure[r] = prior
            self.goes[r], self.unsure[r] = self.goes_prior, self.unsure_prior

    def choose(self, ctx: DraftContext) -> Plan:
        """The drafter and K for this round (a plain step when nothing pays), from past rounds
        only: never from this round's outcome, so greedy output stays identical."""
        rows = [b for b, a in enumerate(ctx.active) if a]
        batch = len(ctx.histories)
        # The verify pass packs each row's real tokens: every running row scores its last
        # token, and a drafting row its drafts too (rows without guesses add nothing).
        base = [1 if h else 0 for h in ctx.histories]                        # [B]

        def verify(extra) -> float:       # extra[b]: row b's drafts
            return self.costs.verify_pass([n + e for n, e in zip(base, extra)])

        plain = verify([0] * batch)
        best = ("plain", 0, 1.0 / plain)
        can_probe = []
        matches = self.ngram.matches(ctx, self.max_k) if self.ngram is not None else []
        if matches:
            guesses = [len(matches[b][0]) if ctx.active[b] else 0 for b in range(batch)]
            longest = max(guesses, default=0)
            cv = [verify([min(k, g) for g in guesses]) for k in range(longest + 1)]
            weighed = {b: self._ngram_weighed(matches[b], b) for b in rows}
            for k in range(1, longest + 1):
                e = _mean(expected_tokens(weighed[b], min(k, guesses[b])) for b in rows)
                best = max(best, ("ngram", k, e / cv[k]), key=lambda c: c[2])
            if longest and _could_win(lambda k: _mean(
                    expected_tokens([OPTIMISTIC] * min(k, guesses[b]), k) for b in rows)
                    / cv[k], longest, plain):
                longest_match = max(matches[b][1] for b in rows)
                can_probe.append(self.states[self._ngram_state(longest_match)])
        draft_won = ()
        # A row's guesses past its room (`DraftContext.room`) could add no token: the draft
        # model drafts no more (a static loop, `cut_short` off, drafts K on every active row,
        # and is priced so), and a row with no room at all sits the round out.
        room = ([ctx.room(b, self.max_k) if a else 0 for b, a in enumerate(ctx.active)]
                if self.draft_model is not None else [])
        max_k = max(room, default=0)
        if max_k:
            state = self.states["draft_model"]
            if self.draft_model.cut_short:
                fed = ctx.with_room(self.max_k)
                cv = [verify([min(k, r) for r in room]) for k in range(max_k + 1)]
            else:
                fed = ctx
                cv = [verify([k * a for a in ctx.active]) for k in range(max_k + 1)]
            drafting = fed.active
            catch_up = self._catch_up(fed, [b for b in rows if drafting[b]])
            caught_up = dataclasses.replace(catch_up, lump=0.0)
            others, won = best[2], False
            weighed = {b: pooled(state.alphas[b]) for b in rows}
            for k in range(1, max_k + 1):
                e, steps, verified = self._draft_round(rows, k, room, weighed, cv, verify)
                won = won or e / caught_up.cost(e, steps, verified) > others
                best = max(best, ("draft_model", k, e / catch_up.cost(e, steps, verified)),
                           key=lambda c: c[2])
            draft_won = tuple(won if d else None for d in drafting)
            optimistic = [_mean(expected_tokens([OPTIMISTIC] * k, min(k, room[b]))
                                for b in rows) for k in range(max_k + 1)]
            # A probe is a cheap look; one that must first catch up on a long stretch (a
            # prompt the draft model has not read) would pay that whole lump to learn a
            # little, so it is bought on merit or not at all (the rent-or-buy rule above).
            if catch_up.lump <= plain and _could_win(
                    lambda k: optimistic[k] / catch_up.cost(optimistic[k], k - 1, cv[k]),
                    max_k, plain):
                can_probe.insert(0, state)

        name, k, probe = best[0], best[1], None
        if k == 0:
            for state in can_probe:
                if state.idle_rounds + 1 >= state.probe_gap:
                    name, k, probe = state.drafter, 1, state.name
                    break
        return self._plan(ctx, name, k, probe, matches, draft_won, room)

    def _stops(self) -> bool:
        """Whether the draft model stops a row's round after a guess it is unsure of (the
        eager one; a static loop drafts K): its rounds are priced as run and learnt as two
        kinds of guess (GOES)."""
        return (self.draft_model is not None and self.draft_model.cut_short
                and getattr(self.draft_model, "stop_below", 0.0) > 0)

    def _draft_prior(self) -> float:
        """The draft model's estimates before a request's first round: of its sure guesses
        where it stops after unsure ones, of every guess where it does not."""
        return self.priors["draft_model/sure" if self._stops() else "draft_model"]

    def _draft_round(self, rows: list[int], k: int, room: list[int], weighed: dict, cv,
                     verify) -> tuple[float, float, float]:
        """(tokens committed per row on average, draft steps after the first, verify
        seconds) of a draft-model round drafting up to k guesses per row (room: [B] the most
        each row may draft; cv[j]: the verify pass with j guesses per row, within its room;
        verify(extra): the pass with extra[b] guesses on row b).

        A draft that does not stop drafts all k: E = 1 + a_1 + a_1 a_2 + .... One that stops
        (`_stops`) commits E as `expected_tokens` prices it with the row's share of sure
        guesses g and the unsure ones' acceptance u (UNSURE's estimate). A round drafts a j-th
        guess with probability 1 - prod_b (1 - g_b^(j-1)) over the rows with room for it. One
        row's verify pass is priced over its distribution of guesses; a batch's at the rows'
        expected guesses (`_interpolated`)."""
        if not self._stops():
            e = _mean(expected_tokens(weighed[b], min(k, room[b])) for b in rows)
            return e, k - 1, cv[k]
        e = _mean(expected_tokens(weighed[b], min(k, room[b]), self.goes[b], self.unsure[b])
                  for b in rows)
        steps = 0.0
        for j in range(2, k + 1):             # a j-th guess on a row with room for it
            none = 1.0
            for b in rows:
                if min(k, room[b]) >= j:
                    none *= 1.0 - self.goes[b] ** (j - 1)
            steps += 1.0 - none
        if len(rows) == 1:                    # the row's own distribution of guesses
            b, go = rows[0], self.goes[rows[0]]
            last = min(k, room[b])
            verified = sum(go ** (j - 1) * (1.0 - go if j < last else 1.0) * cv[j]
                           for j in range(1, last + 1))
        else:                                 # each row's expected guesses, interpolated
            mean = {b: sum(self.goes[b] ** (j - 1) for j in range(1, min(k, room[b]) + 1))
                    for b in rows}
            verified = _interpolated(verify, mean, len(room))
        return e, steps, verified

    def _catch_up(self, ctx: DraftContext, rows: list[int]) -> "_DraftCosts":
        """The draft model's costs this round. Its first forward reads the committed tokens
        each row has not fed it: one or two once it keeps up, a whole history after plain
        rounds or for a new request. Rows that far behind catch up alone first (the lump), a
        one-off price for drafting from now on, spread over the tokens the rows are expected
        to still commit with the draft model. Nobody knows how long an answer will run; one
        that has run n tokens is taken to run about n more (within MIN_HORIZON..HORIZON and its
        budget). So a short answer after a long prompt (a question about a document) never
        pays the prompt's catch-up, while one that keeps going pays it once drafting would have
        saved about as much as it costs: a rent-or-buy rule that forgoes at most about the
        lump's price, LUMP_PREMIUM above its time (`_DraftCosts.cost`). A request near its
        end, or a busy batch, does not pay for a few drafted rounds; nor does one whose text
        prompt lookup drafts better, for the rounds it finds no match in (`_draft_share`)."""
        lags = self.draft_model.lags(ctx)
        lump = sum(self.costs.draft_pass([n - 1]) for n in lags if n > LONG_CATCH_UP)
        first = max([n for n in lags if n <= LONG_CATCH_UP] + [1])
        return _DraftCosts(step=self.costs.draft_pass([1] * len(rows)),
                           first=self.costs.draft_pass([first] * len(rows)), lump=lump,
                           horizon=max(1.0, self._horizon(ctx, rows)
                                       * self._draft_share(rows)))

    def _draft_share(self, rows: list[int]) -> float:
        """The share of the rows' remaining rounds the draft model is expected to draft in
        once caught up: the share of their rounds so far it would have won with no catch-up to
        pay and prompt lookup did not copy (`observe`; weighed as the mean with a prior of 1
        counted PRIOR_COUNT times). A rewrite that prompt lookup copies from the prompt has
        rounds with no match, where a draft model that never read the prompt looks worth buying
        against a plain step; bought, it would draft in those few rounds only, having spent a
        lump of ~6 plain steps (replayed at 64 tokens: three rewrites 76-85% -> 97-119% of the
        best fixed setting, benchmarks/RESULTS.md, "Rent or buy: the draft model's catch-up
        ...")."""
        return _mean((self.draft_wins[b] + PRIOR_COUNT) / (self.rounds[b] + PRIOR_COUNT)
                     for b in rows) if rows else 1.0

    def _horizon(self, ctx: DraftContext, rows: list[int]) -> float:
        """Tokens the rows are expected to still commit, on average: as many as they have
        committed so far, within MIN_HORIZON..HORIZON and their budgets (see _catch_up)."""
        remaining = ctx.remaining or [HORIZON] * len(ctx.active)
        generated = ctx.generated or [HORIZON] * len(ctx.active)
        return max(1.0, _mean(min(remaining[b], max(generated[b], MIN_HORIZON), HORIZON)
                              for b in rows))

    def _plan(self, ctx: DraftContext, name: str, k: int, probe: str | None, matches,
              draft_won: tuple[bool | None, ...], room: list[int]) -> Plan:
        if k == 0:
            untried = any(a and self._draft_untried(b) for b, a in enumerate(ctx.active))
            return dataclasses.replace(PLAIN, notes=Decision((None,) * len(ctx.active),
                                                             draft_won=draft_won),
                                       wants_sure=untried)
        if name == "ngram":
            feeds = tuple(self._ngram_state(n) if n else None for _, n in matches)
            lengths = tuple(n for _, n in matches)
            return Plan(self.ngram, k, f"ngram:{k}", Decision(feeds, probe, draft_won, lengths))
        feeds = tuple("draft_model" if a else None for a in ctx.active)
        return Plan(self.draft_model, k, f"draft_model:{k}",
                    Decision(feeds, probe, draft_won, rooms=tuple(room)))

    def observe(self, plan: Plan, num_accepted, num_drafted, draft_seconds,
                verify_seconds, target_sure=None, last_sure=None) -> None:
        """Learn acceptance from the round's outcome (its timings are not used: see above), and
        from how sure the target was of a plain step's tokens (`_hear_target`); last_sure:
        whether a draft that stops was sure of each row's last guess (`_learn_stop`)."""
        decision: Decision = plan.notes
        if target_sure is not None and plan.k == 0:
            self._hear_target(target_sure)
        copied = [plan.drafter is self.ngram and plan.k > 0 and n > 0 for n in num_accepted]
        copied += [False] * (len(decision.draft_won) - len(copied))
        for row, won in enumerate(decision.draft_won):
            if won is not None:
                # A round in which a prompt-lookup guess was accepted copied text: the draft
                # model, however it was priced, was not what the row needed. Counted as won,
                # a rewrite's first rounds (a 1-token match copied, then none) bought the
                # draft's read of its prompt at once (replayed, benchmarks/RESULTS.md,
                # "A fast-memory calibration, the draft's prior, and copied rounds").
                self.rounds[row] += 1
                self.draft_wins[row] += won and not copied[row]
        used = set(decision.feeds)
        for state in self.states.values():
            state.idle_rounds = 0 if state.name in used else state.idle_rounds + 1
        draft = self.states.get("draft_model")
        if draft is not None:
            for row, feed in enumerate(decision.feeds):
                if feed != draft.name and row < len(draft.alphas):
                    _relax(draft.alphas[row], draft.tally[row], self._draft_prior())
                    if self._stops():
                        self.goes[row] += RELAX * max(0.0, self.goes_prior - self.goes[row])
                        self.unsure[row] += RELAX * max(0.0, self.unsure_prior
                                                        - self.unsure[row])
        if plan.k == 0:
            return
        for row, (n, d) in enumerate(zip(num_accepted, num_drafted)):
            if not d or decision.feeds[row] is None:
                continue
            if plan.drafter is self.ngram:
                self._learn_match(row, decision.lengths[row], n, d)
                continue
            self.draft_rounds[row] += 1
            if self._stops():
                n, d = self._learn_stop(row, n, d, min(plan.k, decision.rooms[row]),
                                        None if last_sure is None else last_sure[row])
                if not d:
                    continue
            state = self.states[decision.feeds[row]]
            state.tally[row][0] += n
            state.tally[row][1] += min(n + 1, d)
            _learn(state.alphas[row], state.seen[row], n, d, WEIGHT)
        for key in used - {None}:
            state = self.states[key]
            if decision.probe is None:   # won on merit
                state.probe_gap = PROBE_BASE
            elif key == decision.probe:   # wait longer before the next probe
                state.probe_gap = min(2 * state.probe_gap, PROBE_MAX)
            # (in a batch, the other rows' states fed by a probe won nothing on merit either)

    def _learn_stop(self, row: int, accepted: int, drafted: int, k: int,
                    last_sure: bool | None = None) -> tuple[int, int]:
        """Learn, from a round of a draft that stops, the row's share of sure guesses and the
        acceptance of unsure ones; return (accepted, drafted) of its sure guesses, from which
        the per-position estimates learn. Every guess but the last was sure (the draft went
        on after it). The last is of the kind the draft reported (`last_sure`); unreported,
        it was unsure where the round drafted fewer than k (its plan's K within the row's
        room; a guess that ends the answer stops a round too, once per answer), and is taken
        as sure where it drafted k. Before the draft reported it, a K = k round's last guess
        was always learnt as sure: a run of K = 1 rounds learnt its unsure guesses' misses
        as the sure ones' acceptance, and priced longer drafts from that. The kinds are
        learnt from the guesses drafted on the committed text (up to the first rejected
        one): past it the draft reads its own wrong guess, which the replay of a trace
        (teacher-forced) cannot follow."""
        on_text = min(accepted + 1, drafted)
        known = last_sure is not None or drafted < k          # the last guess's kind
        unsure_last = drafted < k if last_sure is None else not last_sure
        kinds = [1.0] * min(on_text, drafted - 1)             # went on after these
        if known and on_text == drafted:
            kinds.append(0.0 if unsure_last else 1.0)
        for went_on in kinds:
            self.goes_seen[row] += 1
            self.goes[row] = _ewma(self.goes[row], went_on, _weight(WEIGHT, self.goes_seen[row]))
        if not unsure_last:
            return accepted, drafted
        if accepted >= drafted - 1:            # every sure guess right: the unsure one seen
            self.unsure_seen[row] += 1
            self.unsure[row] = _ewma(self.unsure[row], float(accepted == drafted),
                                     _weight(WEIGHT, self.unsure_seen[row]))
        return min(accepted, drafted - 1), drafted - 1

    def _hear_target(self, target_sure: list[float | None]) -> None:
        """A plain step's `confidence` per row (None: not heard) into the row's mean of them;
        a row the draft model has not drafted for yet takes that mean as its estimates where
        it is above the prior.

        The target's confidence in a token predicts whether the draft would have guessed it:
        teacher-forced over the 64 recorded answers, the draft's top-1 was the target's token
        97.7% of the time where the target's top-1 probability was 0.9-1, 87.5% at 0.8-0.9,
        81.7% at 0.7-0.8, 62-67% at 0.5-0.7 and 45% at 0.4-0.5. It only lifts the prior:
        lowered too, prose the target is unsure of, which still pays at the prior (the draft
        stops early in it), lost in the replays (benchmarks/RESULTS.md, "`auto` hears how
        sure the target was ..."). A draft that stops is lifted to the acceptance of its sure
        guesses that matches the mean (`_sure_guesses`)."""
        draft = self.states.get("draft_model")
        if draft is None:
            return
        prior = self._draft_prior()
        for row, sure in enumerate(target_sure):
            if sure is None or row >= len(self.target_sure):
                continue
            self.sure_seen[row] += 1
            self.target_sure[row] = _ewma(self.target_sure[row], sure,
                                          _weight(WEIGHT, self.sure_seen[row]))
            if self._draft_untried(row):
                draft.alphas[row] = [max(prior, self._sure_guesses(row))] * self.max_k

    def _sure_guesses(self, row: int) -> float:
        """The acceptance the row's mean target confidence predicts for the guesses the draft
        model's estimates are of: every guess, or where it stops (`_stops`) the sure ones, so
        that with its unsure ones (GOES, UNSURE) they average that mean (at most 1)."""
        heard = self.target_sure[row]
        if not self._stops():
            return heard
        go = self.goes[row]
        return min(1.0, (heard - (1.0 - go) * self.unsure[row]) / go)

    def _draft_untried(self, row: int) -> bool:
        """Whether the row's draft model has not drafted yet: the rows whose plain steps
        `auto` hears (`_hear_target`)."""
        return self.draft_model is not None and not self.draft_rounds[row]

    def _ngram_state(self, n: int) -> str:
        """The state a guess following a match of n tokens learns in: one per length, and a
        copy in progress (n >= COPYING) on its own."""
        return COPY_STATE if n >= COPYING else f"ngram/{n}"

    def _ngram_weighed(self, match: tuple[list[int], int], row: int) -> list[float]:
        """The row's acceptance per position for its match; none without a match (the row
        gets the target's token only). Guess i follows the match grown by the i - 1 guesses
        before it, so it is weighed at the state of that length: a 1-token match in a passage
        being copied drafts as far as the longer matches it grows into keep being right (the
        rewrites of the recorded traces; benchmarks/RESULTS.md, "A match grows by each guess
        accepted")."""
        draft, n = match
        return [self.states[self._ngram_state(n + i)].alphas[row][0] for i in range(len(draft))]

    def _learn_match(self, row: int, length: int, accepted: int, drafted: int) -> None:
        """Learn an n-gram round's outcome for one row: each guess observed (the accepted
        ones, then the rejected one if any) in the state of the match it followed."""
        for i, outcome in enumerate([1] * accepted + [0] * (accepted < drafted)):
            state = self.states[self._ngram_state(length + i)]
            _learn_tied(state.alphas[row], state.seen[row], outcome,
                        COPY_WEIGHT if state.name == COPY_STATE else NGRAM_WEIGHT)


@dataclasses.dataclass(frozen=True)
class _DraftCosts:
    step: float                   # one batched draft decode step
    first: float                  # the round's batched first forward (1-2 tokens per row)
    lump: float                   # rows far behind, catching up alone first
    horizon: float                # tokens the lump is spread over

    def cost(self, e: float, steps: float, verified: float) -> float:
        """Seconds per round that commits e tokens on average, drafting `steps` guesses after
        the first and verifying in `verified` seconds: its forwards and verify pass plus its
        share of the lump (at LUMP_PREMIUM)."""
        lump = self.lump * (1 + LUMP_PREMIUM)
        return self.first + steps * self.step + verified + lump * e / self.horizon


def _interpolated(verify, drafted: dict[int, float], batch: int) -> float:
    """verify(extra) for rows b guessing drafted[b] tokens on average (the others none): the
    passes at each row's whole guesses below and above, interpolated by where the total lies
    between theirs."""
    low = [int(drafted.get(b, 0)) for b in range(batch)]
    high = [math.ceil(drafted.get(b, 0)) for b in range(batch)]
    span = sum(high) - sum(low)
    if not span:
        return verify(low)
    share = (sum(drafted.values()) - sum(low)) / span
    return verify(low) + share * (verify(high) - verify(low))


def _could_win(value, max_k: int, plain: float) -> bool:
    """Whether a drafter whose guesses were accepted at OPTIMISTIC would beat a plain step
    (a pass of `plain` seconds) for some K at this round's costs (value(k): committed tokens
    per second drafting k; rows it has no guesses for commit one). A probe that could not
    change the plan is not worth its price (in a busy batch the draft model rarely is, nor a
    match of a few rows)."""
    return any(value(k) > 1.0 / plain for k in range(1, max_k + 1))


def _learn(alphas: list[float], seen: list[int], accepted: int, drafted: int,
           weight: float = WEIGHT) -> None:
    """Update one row's per-position acceptance after a round that drafted `drafted`."""
    for i in range(min(accepted + 1, drafted)):     # positions whose outcome was observed
        seen[i] += 1
        alphas[i] = _ewma(alphas[i], 1.0 if i < accepted else 0.0, _weight(weight, seen[i]))
    if accepted == drafted:
        # Every guess was right: the positions past the round are unobserved, but the
        # evidence says they are at least as good as the last one we saw.
        for i in range(drafted, len(alphas)):
            alphas[i] = _ewma(alphas[i], max(alphas[i], alphas[drafted - 1]), SPREAD)


def _learn_tied(alphas: list[float], seen: list[int], outcome: float, weight: float) -> None:
    """Update one row's acceptance (an n-gram state's one value for every position) with one
    guess's outcome (1: accepted, 0: rejected)."""
    seen[0] += 1
    alphas[0] = _ewma(alphas[0], outcome, _weight(weight, seen[0]))


def _relax(alphas: list[float], tally: list[int], prior: float) -> None:
    """One round sat out: move one row's estimates below its mean acceptance (`tally`: guesses
    accepted, guesses observed; the prior counted PRIOR_COUNT times) RELAX of the way up to
    it; none above it moves."""
    mean = (prior * PRIOR_COUNT + tally[0]) / (PRIOR_COUNT + tally[1])
    alphas[:] = [a + RELAX * (mean - a) if a < mean else a for a in alphas]


def _weight(weight: float, seen: int) -> float:
    """The weight of a state's n-th observation of a position: 1 / (PRIOR_COUNT + n), the
    running mean of the prior and the outcomes so far, until that falls to the state's own
    EWMA weight."""
    return max(weight, 1.0 / (PRIOR_COUNT + seen))


def _ewma(old: float, new: float, weight: float) -> float:
    return (1 - weight) * old + weight * new


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
