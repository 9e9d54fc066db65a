"""One round of speculative decoding: propose -> verify -> accept -> roll back. The contract.

Vocabulary (used with these meanings everywhere in specrt; other modules point here):
- *draft tokens*: the K guesses a drafter proposes for a row (NO_DRAFT pads shorter rows).
- *accepted tokens*: the longest prefix of the drafts the target agrees with — greedy: each
  equals the target's argmax; sampling: each passed the min(1, p/q) test.
- *rejected position*: the first draft the target did not accept; it and all later drafts
  are discarded.
- *recovered token*: the target's own token emitted at the rejected position — its argmax, or
  a draw from the residual max(0, p - q) normalised.
- *bonus token*: when all K drafts are accepted, the target's token after the last draft,
  which its verify pass computed for free.
So a round commits accepted + 1 tokens per row (>= 1, never fewer than plain decoding), and a
round with no drafts is exactly a plain decoding step.

The round, in order (`run_round`):
1. the planner *chooses* a plan (a drafter and K, or a plain step) from past rounds only;
2. the drafter *proposes* up to K draft tokens per active row;
3. the target *verifies* [last committed token] + drafts in ONE pass;
4. *acceptance* (greedy or rejection sampling, with caller-drawn randomness) picks the
   accepted prefix and the recovered / bonus token;
5. *rollback*, of both caches, here and nowhere else: the target's cache is truncated to the
   committed prefix, and the drafter that proposed is told how many of its drafts were kept;
6. the planner *observes* the outcome, with its plan handed back.

Invariant: the target cache holds K/V for every committed token except the last one, which is
fed as the first token of the next verify pass. Rollback of the rejected tail is a truncate.
Randomness: every draw uses the request's generator, in a fixed order (draft draws, then
uniforms and noise for acceptance), so a seed reproduces a run with the same plans.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable

import torch

from specrt.kernels import draw_randomness, greedy_accept, rejection_sample
from specrt.model.kv_cache import StaticKVCache
from specrt.model.transformer import Transformer
from specrt.spec.drafters.base import DraftContext, Proposal, right_pad
from specrt.spec.planners.base import Plan, Planner
from specrt.spec.sampling import SamplingParams, choose, warp

if TYPE_CHECKING:
    from specrt.model.graphs import StaticForward

StaticForwards = Callable[[int, int], "StaticForward"]   # (batch, T) -> the target's runner


@dataclasses.dataclass
class RoundOutcome:
    committed: list[list[int]]   # [B] tokens committed this round per row (accepted + 1)
    num_accepted: list[int]      # [B] accepted drafts per row
    num_drafted: list[int]       # [B] real drafts per row


@dataclasses.dataclass
class RoundResult:
    plan: Plan                   # what the planner chose (plain if the drafter had nothing)
    proposal: Proposal | None    # the drafts that were verified
    outcome: RoundOutcome
    draft_seconds: float
    verify_seconds: float


def run_round(target: Transformer, cache: StaticKVCache, planner: Planner | None,
              ctx: DraftContext, static_forward: StaticForwards | None = None) -> RoundResult:
    """One round over the rows of `ctx` (see the module docstring for the contract)."""
    t0 = time.perf_counter()
    plan = planner.choose(ctx) if planner is not None else None
    proposal = plan.drafter.propose(ctx, plan.k) if plan is not None and plan.k else None
    t1 = time.perf_counter()
    last = [h[-1] for h in ctx.histories]
    outcome = verify_and_accept(target, cache, last, ctx.active, proposal, ctx.params,
                                ctx.generator, static_forward)
    t2 = time.perf_counter()
    if proposal is not None:
        plan.drafter.rollback(outcome.num_accepted)
    if planner is not None:
        planner.observe(plan, outcome.num_accepted, outcome.num_drafted, t1 - t0, t2 - t1)
    if proposal is None and plan is not None and plan.k:
        plan = dataclasses.replace(plan, drafter=None, k=0, label="plain")
    plan = plan if plan is not None else Plan(None, 0, "plain")
    return RoundResult(plan, proposal, outcome, t1 - t0, t2 - t1)


def verify_and_accept(target: Transformer, cache: StaticKVCache, last_tokens: list[int],
                      active: list[bool], proposal: Proposal | None, params: SamplingParams,
                      generator: torch.Generator | None,
                      static_forward: StaticForwards | None = None) -> RoundOutcome:
    """Score [last committed token] + drafts in ONE target pass, accept per row, and roll the
    target's cache back to the committed prefix.

    Inactive rows (finished requests) commit nothing. In the eager forward they are
    zero-length rows; a static forward (`static_forward(B, T)` returns the runner, a CUDA
    graph on CUDA) computes them too, and the rollback puts their length back.
    """
    B = len(last_tokens)
    device = target.device
    start = cache.host_lengths()[:B]
    last = torch.tensor(last_tokens, dtype=torch.int64)[:, None]           # [B, 1]
    if proposal is None:    # a plain decoding step
        if static_forward is not None:
            logits = static_forward(B, 1).run(last.to(device))
            cache.truncate([s + int(a) for s, a in zip(start, active)])
        else:
            logits = target.forward(last.to(device), cache, num_valid=[int(a) for a in active])
        tokens, _ = choose(logits[:, 0], params, generator)                 # [B]
        return _outcome(tokens[:, None].tolist(), [0] * B, [0] * B, active)

    k = proposal.k
    drafts = proposal.tokens.to(device)                                     # [B, K]
    ids = torch.cat([last.to(device), drafts.clamp(min=0)], dim=1)          # [B, K + 1]
    if static_forward is not None:
        logits = static_forward(B, k + 1).run(ids)
    else:
        logits = target.forward(ids, cache, num_valid=[(k + 1) * a for a in active])
    if params.greedy:
        n, out = greedy_accept(logits, drafts)
    else:
        p = warp(logits, params)                                             # [B, K + 1, V]
        uniforms, noise = draw_randomness(B, k, p.shape[-1], generator, device)
        n, out = rejection_sample(p, proposal.probs, drafts, uniforms, noise)
    num_acc = n.tolist()
    # Roll back the rejected drafts: keep the last token + the accepted drafts.
    cache.truncate([s + (1 + a if act else 0) for s, a, act in zip(start, num_acc, active)])
    return _outcome(out.tolist(), num_acc, proposal.counts, active)


def _outcome(out: list[list[int]], num_acc: list[int], drafted: list[int],
             active: list[bool]) -> RoundOutcome:
    return RoundOutcome(
        committed=[row[: a + 1] if act else [] for row, a, act in zip(out, num_acc, active)],
        num_accepted=[a if act else 0 for a, act in zip(num_acc, active)],
        num_drafted=[d if act else 0 for d, act in zip(drafted, active)])


def prefill(target: Transformer, cache: StaticKVCache, prompts: list[list[int]],
            params: SamplingParams, generator: torch.Generator | None) -> list[int]:
    """Run the prompts through the target (right-padded to one batch) and choose each row's
    first new token. Afterwards the cache holds exactly the prompt tokens."""
    ids = right_pad(prompts)
    logits = target.forward(ids.to(target.device), cache, num_valid=[len(p) for p in prompts],
                            last_only=True)
    tokens, _ = choose(logits[:, 0], params, generator)
    return tokens.tolist()
