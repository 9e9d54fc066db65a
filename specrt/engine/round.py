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
2. the drafter *proposes* up to K draft tokens per active row (none past one that ends the
   row's answer or past what its budget has room for, `DraftContext.usable`; the static draft
   loop drafts all K);
3. the target *verifies* [last committed token] + drafts in ONE pass;
4. *acceptance* (greedy or rejection sampling, with caller-drawn randomness) picks the
   accepted prefix and the recovered / bonus token;
5. *rollback*, of both caches, here and nowhere else: the target's cache is truncated to the
   committed prefix, and the drafter that proposed is told how many of its drafts were kept;
6. the planner *observes* the outcome, with its plan handed back.
On an engine with graphs, a round does 2-5 as `specrt.engine.static_round` says: two graph
replays and one host sync on CUDA.

Invariant: the target cache holds K/V for every committed token except the last one, which is
fed as the first token of the next verify pass. Rollback of the rejected tail is a truncate.
Randomness: every sampled row draws from its own request's generator, in a fixed order
(draft draws, then uniforms and noise for acceptance), so a seeded request reproduces its
output whenever its rounds are planned the same way, alone or in any batch (a fixed method;
under `auto` the plan is the batch's, so such a request runs alone: `runs_alone`).
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

import torch

from specrt.errors import CheckpointError
from specrt.kernels import draw_randomness, greedy_accept, rejection_sample
from specrt.model.kv_cache import StaticKVCache
from specrt.model.transformer import Transformer
from specrt.spec.drafters.base import DraftContext, Proposal, StagedDrafter, right_pad
from specrt.spec.planners.base import PLAIN, Plan, Planner
from specrt.spec.sampling import (SamplingParams, choose_rows, confidence, sampling_groups,
                                  warp)

if TYPE_CHECKING:
    from specrt.engine.static_round import StaticRound


@dataclasses.dataclass
class RoundOutcome:
    committed: list[list[int]]   # [B] tokens committed this round per row (accepted + 1)
    num_accepted: list[int]      # [B] accepted drafts per row
    num_drafted: list[int]       # [B] real drafts per row
    drafts: list[list[int]]      # [B] the real drafts verified per row
    target_sure: list[float | None] | None = None   # [B] the target's `confidence` in the
                                 # token a greedy row's plain step committed (None: any other
                                 # row); only where the plan `wants_sure`, and never on an
                                 # engine with graphs (its static rounds read nothing back
                                 # for it)


@dataclasses.dataclass
class RoundResult:
    plan: Plan                   # what the planner chose (plain if the drafter had nothing)
    proposal: Proposal | None    # the drafts that were verified
    outcome: RoundOutcome
    draft_seconds: float
    verify_seconds: float


def run_round(target: Transformer, cache: StaticKVCache, planner: Planner | None,
              ctx: DraftContext, generating: list[bool],
              graphs: "StaticRound | None" = None) -> RoundResult:
    """One round over the rows of `ctx` (see the module docstring for the contract).

    generating: [B] rows that take a step; of those, the ones active in `ctx` may draft, the
    others take a plain step in the same verify pass.
    graphs: an engine's static runners (`specrt.engine.static_round`): a round is then two
    graph replays and one host sync on CUDA (the same bodies run eagerly elsewhere).
    """
    t0 = time.perf_counter()
    planned = planner is not None and any(ctx.active)
    plan = planner.choose(ctx) if planned else PLAIN
    proposal = None
    if plan.k and graphs is not None and isinstance(plan.drafter, StagedDrafter):
        proposal = plan.drafter.propose_staged(ctx, plan.k)   # its device work runs below
    elif plan.k:
        proposal = plan.drafter.propose(ctx, plan.k)
    t1 = time.perf_counter()
    last = [h[-1] if h else 0 for h in ctx.histories]
    outcome = verify_and_accept(target, cache, last, generating, proposal, plan.k, ctx, graphs,
                                sure=plan.wants_sure and graphs is None)
    t2 = time.perf_counter()
    if proposal is not None:
        plan.drafter.rollback(outcome.num_accepted)
    if planned:
        heard = {} if outcome.target_sure is None else {"target_sure": outcome.target_sure}
        if proposal is not None and proposal.last_sure is not None:
            heard["last_sure"] = proposal.last_sure
        planner.observe(plan, outcome.num_accepted, outcome.num_drafted, t1 - t0, t2 - t1,
                        **heard)
    if proposal is None and plan.k:
        plan = PLAIN
    return RoundResult(plan, proposal, outcome, t1 - t0, t2 - t1)


def verify_and_accept(target: Transformer, cache: StaticKVCache, last_tokens: list[int],
                      generating: list[bool], proposal: Proposal | None, k_plan: int,
                      ctx: DraftContext, graphs: "StaticRound | None" = None,
                      sure: bool = False) -> RoundOutcome:
    """Score [last committed token] + drafts in ONE target pass, accept per row, and roll the
    target's cache back to the committed prefix.

    Rows that are not generating commit nothing: in the eager forward they are zero-length
    rows; a static pass (`graphs`) computes them too, and the rollback puts their length back.
    A generating row with no drafts takes a plain step: its token is chosen from the pass's
    first position exactly as a plain decoding step would choose it.
    With `graphs`, a round is `StaticRound.run` (one host sync) wherever its pass fits the
    cache; the eager pass below serves the rest.
    sure: also report the target's `confidence` in each greedy row's plain step's token
    (`target_sure`; the draft's agreement it stands for was measured on greedy answers; from
    a screened head's logits where every row is greedy: within 0.0016 of the full head's on
    the 1.5B's steps, benchmarks/RESULTS.md).
    """
    if graphs is not None:
        outcome = graphs.run(last_tokens, generating, proposal, ctx, k_plan)
        if outcome is not None:
            return outcome
    B = len(last_tokens)
    device = target.device
    start = cache.host_lengths()[:B]
    k = proposal.k if proposal is not None else 0
    counts = proposal.counts if proposal is not None else [0] * B
    if proposal is not None and proposal.pending is not None:
        proposal.pending()                            # a staged draft graph: fill its tokens
        proposal.pending = None
    ids = torch.tensor(last_tokens, dtype=torch.int64)[:, None].to(device)         # [B, 1]
    if k:
        drafts = proposal.tokens.to(device)                                 # [B, K]
        ids = torch.cat([ids, drafts.clamp(min=0)], dim=1)                  # [B, K + 1]
    # Each row scores its last token and its own drafts: a row with fewer (or none) costs
    # only those, and their logits are all acceptance reads; where every row is greedy only
    # their argmax (and a plain step's confidence) is read (`argmax_only`: the head screened
    # where the backend can).
    greedy = all(ctx.params[b].greedy for b in range(B) if generating[b])
    logits = target.forward(ids, cache, num_valid=[(1 + c) * g
                                                   for c, g in zip(counts, generating)],
                            argmax_only=greedy)
    num_acc, out = _accept(logits, proposal, counts, k_plan, generating, ctx)
    target_sure = None
    if sure:
        plain = [b for b in range(B)
                 if generating[b] and counts[b] == 0 and ctx.params[b].greedy]
        if plain:
            target_sure = [None] * B
            for b, s in zip(plain, confidence(_rows(logits, plain)[:, 0]).tolist()):
                target_sure[b] = s
    # Roll back the rejected drafts: keep the last token + the accepted drafts.
    cache.truncate([s + (1 + a if g else 0) for s, a, g in zip(start, num_acc, generating)])
    return RoundOutcome(
        committed=[row[: a + 1] if g else [] for row, a, g in zip(out, num_acc, generating)],
        num_accepted=[a if g else 0 for a, g in zip(num_acc, generating)],
        num_drafted=[d if g else 0 for d, g in zip(counts, generating)],
        drafts=_drafts_as_lists(proposal, B), target_sure=target_sure)


def _drafts_as_lists(proposal: Proposal | None, rows: int) -> list[list[int]]:
    if proposal is None:
        return [[] for _ in range(rows)]
    return [row[:n] for row, n in zip(proposal.tokens.tolist(), proposal.counts)]


def _accept(logits: torch.Tensor, proposal: Proposal | None, counts: list[int], k_plan: int,
            generating: list[bool], ctx: DraftContext) -> tuple[list[int], list[list[int]]]:
    """Acceptance per row of logits [B, K + 1, V]: greedy rows together, each sampled row with
    its own warp and generator. Returns (accepted drafts [B], tokens [B][K + 1])."""
    B = logits.shape[0]
    num_acc, out = [0] * B, [[0] for _ in range(B)]
    plain = [b for b in range(B) if generating[b] and counts[b] == 0]
    if plain:   # a plain step per row: what plain decoding would choose
        tok, _ = choose_rows(_rows(logits, plain)[:, 0], [ctx.params[b] for b in plain],
                             [ctx.generators[b] for b in plain])
        for b, t in zip(plain, tok.tolist()):
            out[b] = [t]
    drafted = [b for b in range(B) if generating[b] and counts[b] > 0]
    greedy = [b for b in drafted if ctx.params[b].greedy]
    if greedy:
        n, toks = greedy_accept(_rows(logits, greedy),
                                _rows(proposal.tokens, greedy).to(logits.device))
        for b, a, row in zip(greedy, n.tolist(), toks.tolist()):
            num_acc[b], out[b] = a, row
    drafted_rows = set(drafted)
    sampled = [b in drafted_rows for b in range(B)]
    for rows, params in sampling_groups(ctx.params, sampled):
        p = warp(logits[rows], params)                                       # [n, K + 1, V]
        # Drawn per row, for the planned K whatever this round's width: a seeded request
        # consumes the same randomness alone or beside requests whose drafts are longer.
        draws = [draw_randomness(1, max(k_plan, proposal.k), p.shape[-1], ctx.generators[b],
                                 logits.device) for b in rows]
        uniforms = torch.cat([u[:, : proposal.k] for u, _ in draws])        # [n, K]
        noise = torch.cat([e for _, e in draws])                             # [n, V]
        q = proposal.probs[rows] if proposal.probs is not None else None
        n, toks = rejection_sample(p, q, proposal.tokens[rows].to(logits.device), uniforms,
                                   noise)
        for b, a, row in zip(rows, n.tolist(), toks.tolist()):
            num_acc[b], out[b] = a, row
    return num_acc, out


def _rows(t: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """t[rows]: a view where the rows are consecutive (a lone request's logits, 10 MB for a
    K = 16 pass, are not copied), else the copy advanced indexing makes."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return t[rows[0]:rows[0] + len(rows)]
    return t[rows]


def prefill_rows(target: Transformer, cache: StaticKVCache, prompts: list[list[int]],
                 params: list[SamplingParams], generators: list[torch.Generator | None],
                 rows: list[int]) -> list[int | CheckpointError]:
    """Prefill the given rows (their prompts right-padded into one pass; rows not listed take
    no tokens) and choose each listed row's first new token, in the order of `rows`: or, for
    a row whose logits are NaN or +inf, the CheckpointError that fails its request alone."""
    B = len(prompts)
    ids = right_pad(prompts)
    logits = target.forward(ids.to(target.device), cache,
                            num_valid=[len(p) for p in prompts], last_only=True)   # [B, 1, V]
    members = set(rows)
    listed = [b in members for b in range(B)]
    first = logits[:, 0]                                                             # [B, V]
    # NaN logits take id 0 (argmax and the samplers alike), and an answer of it ran on
    # (-inf is an id a shortlisted head does not score)
    broken = (torch.isnan(first) | torch.isposinf(first)).any(dim=-1).tolist()      # [B]
    if any(broken):                       # nothing is drawn for those rows, nor read
        listed = [ok and not bad for ok, bad in zip(listed, broken)]
        first = first.masked_fill(torch.tensor(broken, device=first.device)[:, None], 0.0)
    tokens, _ = choose_rows(first, params, generators, listed)
    return [CheckpointError("the model computed logits that are NaN or infinite for this "
                            "prompt: its weights hold such values (a damaged or badly "
                            "converted checkpoint) or a pass overflows its dtype; fetch or "
                            "convert the model again, or load it in bfloat16 or float32")
            if broken[b] else int(tokens[b]) for b in rows]
