"""One round of speculative decoding: propose -> verify -> accept -> commit/rollback.

Vocabulary (used with these meanings everywhere in specrt):
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

Invariant: the target cache holds K/V for every committed token except the last one, which is
fed as the first token of the next verify pass. Rollback of the rejected tail is a truncate.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable

import torch

from specrt.config import SamplingParams
from specrt.drafters.base import NO_DRAFT, Proposal, right_pad
from specrt.kernels import greedy_accept, rejection_sample
from specrt.kernels.reference import draw_randomness
from specrt.kv_cache import StaticKVCache
from specrt.model import Transformer
from specrt.sampling import choose, warp

if TYPE_CHECKING:
    from specrt.cuda_graph import StaticForward


@dataclasses.dataclass
class RoundOutcome:
    committed: list[list[int]]   # [B] tokens committed this round per row (accepted + 1)
    num_accepted: list[int]      # [B] accepted drafts per row
    num_drafted: list[int]       # [B] real drafts per row


def verify_and_accept(target: Transformer, cache: StaticKVCache, last_tokens: list[int],
                      active: list[bool], proposal: Proposal | None, params: SamplingParams,
                      generator: torch.Generator | None,
                      static_forward: Callable[[int, int], "StaticForward"] | None = None
                      ) -> RoundOutcome:
    """Score [last committed token] + drafts in ONE target pass and accept per row.

    Inactive rows (finished requests) commit nothing. In the eager forward they are
    zero-length rows; a static forward (`static_forward(B, T)` returns the runner, a CUDA
    graph on CUDA) computes them too, and the rollback below puts their length back.
    """
    B = len(last_tokens)
    device = target.device
    start = cache.host_lengths()[:B]
    last = torch.tensor(last_tokens, dtype=torch.int64)[:, None]           # [B, 1]
    k = proposal.k if proposal is not None else 0

    if k == 0:  # a plain decoding step
        if static_forward is not None:
            logits = static_forward(B, 1).run(last.to(device))
            cache.truncate([s + int(a) for s, a in zip(start, active)])
        else:
            logits = target.forward(last.to(device), cache, num_valid=[int(a) for a in active])
        tokens, _ = choose(logits[:, 0], params, generator)                 # [B]
        num_acc = [0] * B
        out = tokens[:, None].tolist()
        drafted = [0] * B
    else:
        drafts = proposal.tokens.to(device)                                 # [B, K]
        ids = torch.cat([last.to(device), drafts.clamp(min=0)], dim=1)      # [B, K + 1]
        if static_forward is not None:
            logits = static_forward(B, k + 1).run(ids)
        else:
            logits = target.forward(ids, cache, num_valid=[(k + 1) * a for a in active])
        if params.greedy:
            n, out_t = greedy_accept(logits, drafts)
        else:
            p = warp(logits, params)                                         # [B, K + 1, V]
            q = proposal.probs                                               # [B, K, V] | None
            uniforms, noise = draw_randomness(B, k, p.shape[-1], generator, device)
            n, out_t = rejection_sample(p, q, drafts, uniforms, noise)
        num_acc = n.tolist()
        out = out_t.tolist()
        drafted = proposal.counts
        # Roll back the rejected drafts: keep last token + accepted drafts.
        cache.truncate([s + (1 + a if act else 0)
                        for s, a, act in zip(start, num_acc, active)])

    committed = [row[: a + 1] if act else [] for row, a, act in zip(out, num_acc, active)]
    return RoundOutcome(committed=committed, num_accepted=[a if act else 0 for a, act
                                                            in zip(num_acc, active)],
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


__all__ = ["NO_DRAFT", "RoundOutcome", "verify_and_accept", "prefill"]
