"""Guesses that could add no token are neither drafted nor verified: none past one that
ends the answer (accepted, the answer stops there; rejected, every later guess is too), and none
past one fewer than the tokens a row's budget has left (with r left, r - 1 accepted guesses and
the bonus token fill it). What each drafter proposes, what `auto` plans, and that output stays
what plain decoding gives."""
import dataclasses

import pytest
import torch

import specrt
from specrt.model.transformer import Transformer
from specrt.spec.config import SpecConfig
from specrt.spec.costs import CostModel
from specrt.spec.drafters.base import NO_DRAFT, DraftContext
from specrt.spec.drafters.draft_model import DraftModelDrafter
from specrt.spec.drafters.ngram import NgramDrafter
from specrt.spec.planners.adaptive import AdaptivePlanner
from specrt.spec.sampling import SamplingParams
from tests.helpers import PAYING

K = 6
MAX_SEQ = 256
PROMPT = list(range(40, 70))


def _ctx(histories, remaining=None, ends=None) -> DraftContext:
    B = len(histories)
    return DraftContext([list(h) for h in histories], [True] * B, [SamplingParams()] * B,
                        [None] * B, remaining=remaining, ends=ends)


def test_room_is_one_fewer_than_the_tokens_left():
    ctx = _ctx([[1]] * 4, remaining=[9, 3, 1, 0])
    assert [ctx.room(b, K) for b in range(4)] == [K, 2, 0, 0]
    assert _ctx([[1]]).room(0, K) == K                       # budget unknown: all of k


def test_usable_guesses_stop_after_the_first_that_ends_the_answer_and_at_the_room():
    ctx = _ctx([[1]] * 3, remaining=[50, 50, 3], ends=[frozenset({7, 9})] * 3)
    assert ctx.usable(0, [4, 7, 5, 9]) == [4, 7]
    assert ctx.usable(1, [4, 5, 6]) == [4, 5, 6]
    assert ctx.usable(2, [4, 5, 6]) == [4, 5]
    assert _ctx([[1]]).usable(0, [7, 7, 7]) == [7, 7, 7]      # no ends known


@pytest.fixture(scope="module")
def draft(tiny_draft_dir):
    return Transformer.from_dir(tiny_draft_dir, torch.float32, torch.device("cpu"), MAX_SEQ)


def _guesses(draft, n: int, prompt=PROMPT) -> list[int]:
    """The draft's greedy continuation of a prompt, one full forward per token (the
    reference)."""
    seq = list(prompt)
    for _ in range(n):
        logits = draft.forward(torch.tensor([seq]), draft.new_cache(1, len(seq)), last_only=True)
        seq.append(int(logits[0, 0].argmax()))
    return seq[len(prompt):]


def _drafter(draft, static=False) -> DraftModelDrafter:
    drafter = DraftModelDrafter(draft, draft.cfg.vocab_size, 1, MAX_SEQ, static=static,
                                stop_below=0.0)
    drafter.reset([0])
    return drafter


def test_the_draft_model_stops_after_a_guess_that_ends_the_answer(draft):
    # a prompt whose guesses reach a new id after the first: that id ends the answer
    prompt, ref, end = next((p, ref, i) for p in (PROMPT, *([t] * 3 for t in range(2, 200, 7)))
                            for ref in [_guesses(draft, K, p)]
                            for i in range(1, K) if ref[i] not in ref[:i])
    proposal = _drafter(draft).propose(_ctx([prompt], ends=[frozenset({ref[end]})]), K)
    assert proposal.counts == [end + 1]
    assert proposal.tokens[0, :end + 1].tolist() == ref[:end + 1]
    assert (proposal.tokens[0, end + 1:] == NO_DRAFT).all()


def test_the_draft_model_drafts_only_what_the_budget_has_room_for(draft):
    ref = _guesses(draft, K)
    drafter = _drafter(draft)
    proposal = drafter.propose(_ctx([PROMPT], remaining=[3]), K)
    assert proposal.counts == [2] and proposal.tokens[0].tolist() == ref[:2]
    # one token left: no guess could be committed, so the row sits the round out unread
    drafter = _drafter(draft)
    assert drafter.propose(_ctx([PROMPT], remaining=[1]), K) is None
    assert drafter.seen[0] == 0 and drafter.cache.host_lengths()[0] == 0


def test_a_static_drafter_drafts_k_whatever_the_end_or_budget(draft):
    """The static loop drafts all K (a graph cannot stop on a value it has not read back), in
    its eager rounds too."""
    ref = _guesses(draft, K)
    ctx = _ctx([PROMPT], remaining=[3], ends=[frozenset({ref[0]})])
    assert _drafter(draft, static=True).propose(ctx, K).counts == [K]


def test_prompt_lookup_offers_no_guess_past_the_end_or_the_budget():
    history = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2]          # "1 2" matched: 3 4 5 6 7 8 follow
    ngram = NgramDrafter(1, 3)
    ngram.reset([0, 1, 2])
    ctx = _ctx([history] * 3, remaining=[50, 50, 4], ends=[frozenset(), frozenset({5})] * 2)
    assert [g for g, _ in ngram.matches(ctx, 5)] == [[3, 4, 5, 6, 7], [3, 4, 5], [3, 4, 5]]
    assert ngram.propose(ctx, 5).counts == [5, 3, 3]
    ctx = _ctx([history], remaining=[1])
    assert ngram.matches(ctx, 5) == [([], 0)] and ngram.propose(ctx, 5) is None


class _Lagging:
    """A draft model the planner only prices, row b `lags[b]` tokens behind."""
    name = "draft_model"

    def __init__(self, lags, cut_short=True):
        self._lags, self.cut_short = lags, cut_short

    def lags(self, ctx):
        return [n if a else 0 for n, a in zip(self._lags, ctx.active)]


@pytest.mark.parametrize("remaining, most", [(500, 8), (4, 3), (2, 1), (1, 0)])
def test_auto_plans_the_draft_model_no_further_than_the_budget(remaining, most):
    planner = AdaptivePlanner(8, PAYING, draft_model=_Lagging([1]))     # caught up
    planner.reset([0])
    planner.states["draft_model"].alphas[0][:] = [0.99] * 8     # every guess pays
    plan = planner.choose(_ctx([PROMPT], remaining=[remaining]))
    assert plan.k == most
    assert plan.label == (f"draft_model:{most}" if most else "plain")


def test_auto_prices_no_catch_up_for_a_row_with_no_room():
    """A row with one token left is not fed this round, so how far behind it is costs
    nothing: a long unread prompt there must not shorten the other row's plan."""
    # PAYING's draft costs, timed up to a 300-token catch-up: 3 plain steps
    costs = CostModel(verify=PAYING.verify, draft=[0.05 + 0.01 * t for t in range(1, 301)])
    plans = []
    for lags in ([1, 1], [1, 300]):
        planner = AdaptivePlanner(8, costs, draft_model=_Lagging(lags))
        planner.reset([0, 1])
        planner.states["draft_model"].alphas[0][:] = [0.5] * 8      # the lump would tip it
        ctx = dataclasses.replace(_ctx([PROMPT] * 2, remaining=[40, 1]), generated=[5, 5])
        plans.append(planner.choose(ctx).label)
    assert plans[0] == plans[1] != "plain", plans


@pytest.mark.parametrize("cut_short", [True, False])
def test_auto_prices_each_rows_verify_as_it_is_drafted(cut_short, monkeypatch):
    """The eager draft model drafts a row no further than its room; a static loop (`cut_short`
    off) drafts K on every row, and its verify pass is priced so."""
    planner = AdaptivePlanner(4, PAYING, draft_model=_Lagging([1, 1], cut_short))
    planner.reset([0, 1])
    widths = []
    real = PAYING.verify_pass
    monkeypatch.setattr(planner.costs, "verify_pass", lambda rows: widths.append(list(rows))
                        or real(rows))
    planner.choose(_ctx([PROMPT] * 2, remaining=[40, 3]))             # room: 4 and 2
    assert ([5, 5] in widths) is not cut_short and ([5, 3] in widths) is cut_short, widths


@pytest.fixture(scope="module")
def llm(tiny_noeos_dir, tiny_draft_dir):
    return specrt.LLM(tiny_noeos_dir, draft=tiny_draft_dir, max_seq_len=MAX_SEQ,
                      max_batch_size=2, dtype="float32", draft_stop=0.0)


@pytest.mark.parametrize("spec", [{"method": "draft_model", "num_speculative_tokens": 8},
                                  {"method": "ngram", "num_speculative_tokens": 8},
                                  {"method": "auto", "num_speculative_tokens": 8}])
def test_greedy_output_equals_plain_where_answers_end_mid_round(llm, spec, monkeypatch):
    """An answer ended by an end id the drafts reach, and budgets shorter than a round: the
    tokens are plain decoding's, and no round drafts past either."""
    if spec["method"] == "auto":
        monkeypatch.setattr(llm.engine.planner_for(SpecConfig(**spec)), "costs", PAYING)
    # the tiny target repeats one id, then others: each of these answers reaches a new id
    # (index 6, index 11), which is made to end it
    prompts = [[5, 6, 7, 8], [9, 200, 31, 77, 140, 12]]
    free = [llm.generate(p, max_new_tokens=30).token_ids for p in prompts]
    ends = {free[0][6], free[1][11]}
    assert free[0][:6].count(free[0][6]) == free[1][:11].count(free[1][11]) == 0
    monkeypatch.setattr(llm, "eos_ids", ends)
    drafted_an_end = False
    for budget in (30, 5, 2, 1):
        plain = [llm.generate(p, max_new_tokens=budget).token_ids for p in prompts]
        runs = [llm.submit(p, max_new_tokens=budget, speculative=spec) for p in prompts]
        for run, want in zip(runs, plain):
            steps = [chunk.step for chunk in run.chunks()]
            assert list(run.result().token_ids) == want, (budget, spec)
            done = 1                                     # the prompt's pass gave the first
            for step in steps[1:]:
                assert len(step.draft_tokens) <= max(budget - done - 1, 0), (budget, step)
                assert all(t not in ends for t in step.draft_tokens[:-1]), step
                drafted_an_end |= bool(step.draft_tokens) and step.draft_tokens[-1] in ends
                done += len(step.new_tokens)
    assert plain == [[free[0][0]], [free[1][0]]]
    # prompt lookup never meets these ends in a history (test_prompt_lookup_... above does)
    assert drafted_an_end or spec["method"] == "ngram"
