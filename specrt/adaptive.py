"""Adaptive speculation (method "auto"): choose the drafter and K every round.

Each round the planner scores every option by expected committed tokens per second,

    value(drafter, K) = E[tokens | K, a] / (c_catchup + (K - 1) * c_draft + c_verify(K + 1)),
    E[tokens | K, a]  = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_K,

where a_i is the acceptance probability of draft position i given the earlier ones were
accepted, and c_catchup is the draft model's first forward of the round, over the committed
tokens it has not seen yet (one or two after a drafted round, many after plain rounds).
K = 0 is a plain decoding step (value 1 / c_verify(1)). Options:
- the n-gram drafter, whenever its index has a match (its guesses are free: c_draft = 0,
  and K is at most the match length). Its acceptance is kept per matched suffix length n:
  a guess that follows a 3-token match is right far more often than one after a 1-token
  match, and one average would overrate the second and underrate the first;
- the draft model, K = 1..K_max, run only when it wins.

a_i is estimated per request (per row) and per drafter, as an exponentially weighted average
with a prior; costs come from a calibration at first use (specrt.costs) scaled by the ratio
of measured to predicted round times. The choice depends only on past rounds, never on the
current round's outcome, so greedy output stays identical and sampling stays exact.

A drafter that lost is probed again with K = 1 after `PROBE_BASE` rounds unused, the gap
doubling after each probe until the drafter wins a round on merit, so a text that turns
predictable is noticed without paying much for a drafter that does not pay.
"""
from __future__ import annotations

import dataclasses

from specrt.config import SpecConfig
from specrt.costs import CostModel
from specrt.drafters.base import DraftContext, Proposal
from specrt.drafters.ngram import NgramDrafter, proposal_from_lists

PRIORS = {"draft_model": 0.6, "ngram/1": 0.3, "ngram/2": 0.4, "ngram": 0.5}   # "ngram": n >= 3
# EWMA weight of the newest observation of a position: an average over ~12 rounds. At 0.3
# (~6 rounds) a draft model accepted 63% of the time read below its break-even after two
# rejections in a row, sat out, and was only probed back later; summed calibrated costs over
# 7 e2e prompts put auto at 93-95% of the best fixed method on prose with 0.3, 97-99% with 0.15.
WEIGHT = 0.15
SPREAD = 0.5                  # pull of a fully accepted round on the positions past it
COST_WEIGHT = 0.2             # EWMA weight of the newest measured/predicted time ratio
PROBE_BASE = 16
PROBE_MAX = 512


@dataclasses.dataclass
class DrafterState:
    name: str                     # "draft_model", or "ngram/n" for matches of n tokens
    drafter: str                  # the drafter it belongs to
    alphas: list[list[float]]     # [B][K_max] acceptance per position, per row
    idle_rounds: int = 0          # rounds since this drafter last proposed
    probe_gap: int = PROBE_BASE


def expected_tokens(alphas: list[float], k: int) -> float:
    """1 + a1 + a1 a2 + ... (k terms): tokens a round commits on average."""
    total, run = 1.0, 1.0
    for a in alphas[:k]:
        run *= a
        total += run
    return total


class AdaptivePlanner:
    def __init__(self, max_k: int, costs: CostModel, draft_model=None,
                 ngram: NgramDrafter | None = None):
        self.max_k = max_k
        self.costs = costs
        self.draft_model = draft_model
        self.ngram = ngram
        self.verify_scale = 1.0
        self.draft_scale = 1.0
        self.states: dict[str, DrafterState] = {}
        self._last: tuple[str, int] | None = None
        self._probe: str | None = None    # the state this round probes, if not a choice on merit
        self._ngram: list[tuple[list[int], int]] = []    # per row: (match, its n) this round
        self._used: list[str | None] = []                 # per row: the state this round feeds
        self._predicted_draft = 0.0   # calibrated seconds of this round's drafting

    @classmethod
    def for_engine(cls, engine, spec: SpecConfig) -> "AdaptivePlanner":
        k = spec.num_speculative_tokens
        draft = engine.draft_model_drafter() if engine.draft is not None else None
        costs = CostModel.calibrate(engine.target, engine.draft, k)
        return cls(k, costs, draft, NgramDrafter(spec.prompt_lookup_min, spec.prompt_lookup_max))

    # --- planner protocol -------------------------------------------------------------------
    def begin(self, batch_size: int) -> None:
        self.states = {}
        names = []
        if self.draft_model is not None:
            self.draft_model.begin(batch_size)
            names.append(("draft_model", "draft_model"))
        if self.ngram is not None:
            self.ngram.begin(batch_size)
            names += [(_ngram_state(n), "ngram")
                      for n in range(self.ngram.min_n, self.ngram.max_n + 1)]
        for name, drafter in names:
            prior = PRIORS.get(name, PRIORS[drafter])
            self.states[name] = DrafterState(name, drafter,
                                             [[prior] * self.max_k for _ in range(batch_size)])

    def propose(self, ctx: DraftContext) -> tuple[Proposal | None, str]:
        name, k, self._probe = self.choose(ctx)
        self._last = (name, k) if k else None
        self._used = [None] * len(ctx.active)
        if k and name == "ngram":
            self._used = [_ngram_state(n) if n else None for _, n in self._ngram]
        elif k:
            self._used = ["draft_model" if a else None for a in ctx.active]
        used = set(self._used)
        for state in self.states.values():
            state.idle_rounds = 0 if state.name in used else state.idle_rounds + 1
        if not k:
            return None, "plain"
        if name == "ngram":
            lists = [d[:k] for d, _ in self._ngram]
            return proposal_from_lists(lists, k), f"ngram:{k}"
        self._predicted_draft = (self.costs.draft_seconds(max(self.draft_model.unseen(ctx), 1))
                                 + (k - 1) * self.costs.draft_step)
        return self.draft_model.propose(ctx, k), f"draft_model:{k}"

    def observe(self, num_accepted, num_drafted, draft_seconds, verify_seconds) -> None:
        if self._last is None:
            self.verify_scale = _ewma(self.verify_scale,
                                      verify_seconds / self.costs.verify_seconds(1))
            return
        name, k = self._last
        for row, (n, d) in enumerate(zip(num_accepted, num_drafted)):
            if d == 0 or self._used[row] is None:
                continue
            alphas = self.states[self._used[row]].alphas[row]
            for i in range(min(n + 1, d)):     # positions whose outcome was observed
                alphas[i] = _ewma(alphas[i], 1.0 if i < n else 0.0, WEIGHT)
            if n == d:
                # Every guess was right: the positions past the round are unobserved, but the
                # evidence says they are at least as good as the last one we saw.
                for i in range(d, len(alphas)):
                    alphas[i] = _ewma(alphas[i], max(alphas[i], alphas[d - 1]), SPREAD)
        for key in set(self._used) - {None}:
            state = self.states[key]
            if key == self._probe:    # won nothing on merit: wait longer before the next probe
                state.probe_gap = min(2 * state.probe_gap, PROBE_MAX)
            else:
                state.probe_gap = PROBE_BASE
        self.verify_scale = _ewma(self.verify_scale,
                                  verify_seconds / self.costs.verify_seconds(k + 1))
        if name == "draft_model":
            self.draft_model.accepted(num_accepted)
            if self._predicted_draft > 0:
                self.draft_scale = _ewma(self.draft_scale, draft_seconds / self._predicted_draft)

    # --- the decision -----------------------------------------------------------------------
    def choose(self, ctx: DraftContext) -> tuple[str, int, str | None]:
        """(drafter name, K, the state probed or None) for this round; K = 0: a plain step."""
        rows = [b for b, a in enumerate(ctx.active) if a]
        cv = [self.verify_scale * self.costs.verify_seconds(t)
              for t in range(1, self.max_k + 2)]
        best = ("plain", 0, 1.0 / cv[0])
        can_probe = []

        if self.ngram is not None:
            self._ngram = self.ngram.matches(ctx, self.max_k)
            longest = max((len(self._ngram[b][0]) for b in rows), default=0)
            for k in range(1, longest + 1):
                e = _mean(self._ngram_expected(b, k) for b in rows)
                best = max(best, ("ngram", k, e / cv[k]), key=lambda c: c[2])
            if longest:
                can_probe.append(self.states[_ngram_state(max(self._ngram[b][1] for b in rows))])

        if self.draft_model is not None:
            state = self.states["draft_model"]
            cd = self.draft_scale * self.costs.draft_step
            catchup = self.draft_scale * self.costs.draft_seconds(
                max(self.draft_model.unseen(ctx), 1))
            for k in range(1, self.max_k + 1):
                e = _mean(expected_tokens(state.alphas[b], k) for b in rows)
                cost = catchup + (k - 1) * cd + cv[k]
                best = max(best, ("draft_model", k, e / cost), key=lambda c: c[2])
            can_probe.insert(0, state)

        if best[1] == 0:
            for state in can_probe:
                if state.idle_rounds + 1 >= state.probe_gap:
                    return state.drafter, 1, state.name
        return best[0], best[1], None

    def _ngram_expected(self, row: int, k: int) -> float:
        draft, n = self._ngram[row]
        if not draft:
            return 1.0                        # no match: the row gets the target's token only
        return expected_tokens(self.states[_ngram_state(n)].alphas[row], min(k, len(draft)))


def _ngram_state(n: int) -> str:
    return f"ngram/{n}"


def _ewma(old: float, new: float, weight: float = COST_WEIGHT) -> float:
    return (1 - weight) * old + weight * new


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
