"""Who drafts, and how many tokens, in each round.

A planner owns the drafters of a generation: each round it returns a proposal (or None for a
plain decoding step) and a short label for traces and stats, and afterwards it is told the
outcome. The fixed planner always asks one drafter for K tokens; the adaptive one
(specrt.adaptive) chooses the drafter and K per round from measured costs and acceptance.
"""
from __future__ import annotations

from typing import Protocol

from specrt.drafters.base import DraftContext, Drafter, Proposal


class Planner(Protocol):
    max_k: int

    def begin(self, batch_size: int) -> None: ...

    def propose(self, ctx: DraftContext) -> tuple[Proposal | None, str]: ...

    def observe(self, num_accepted: list[int], num_drafted: list[int],
                draft_seconds: float, verify_seconds: float) -> None: ...


class FixedPlanner:
    """Always ask `drafter` for `k` tokens. A drafter with nothing to offer (an n-gram miss)
    makes the round a plain decoding step rather than a verify pass over nothing."""

    def __init__(self, drafter: Drafter, k: int):
        self.drafter = drafter
        self.max_k = k
        self._proposed = False

    def begin(self, batch_size: int) -> None:
        self.drafter.begin(batch_size)

    def propose(self, ctx: DraftContext) -> tuple[Proposal | None, str]:
        proposal = self.drafter.propose(ctx, self.max_k)
        self._proposed = proposal is not None
        if proposal is None:
            return None, "plain"
        return proposal, f"{self.drafter.name}:{self.max_k}"

    def observe(self, num_accepted, num_drafted, draft_seconds, verify_seconds) -> None:
        if self._proposed:
            self.drafter.accepted(num_accepted)
