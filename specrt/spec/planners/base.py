"""Who drafts, and how many tokens, in each round: the `Plan` a planner returns.

A planner decides; it does not act. Each round `choose` returns a `Plan` (a drafter and K, or
a plain step); the round (`specrt.engine.round`) asks that drafter for K guesses, verifies
them and rolls back both caches; afterwards the planner is told the outcome (`observe`) with
the plan handed back, so it keeps no hidden state between the two calls.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

from specrt.spec.drafters.base import DraftContext, Drafter


@dataclasses.dataclass(frozen=True)
class Plan:
    drafter: Drafter | None   # who drafts this round; None: a plain decoding step
    k: int                    # drafts to ask for (0 with no drafter)
    label: str                # "plain", "draft_model:4", "ngram:3": for traces and stats
    notes: object = None      # the planner's record of why, handed back to its observe
    wants_sure: bool = False  # a plain step: report how sure the target was of each greedy
                              # row's token (`RoundOutcome.target_sure`; eager rounds only)


PLAIN = Plan(None, 0, "plain")


class Planner(Protocol):
    max_k: int                     # the largest K any plan may ask for
    drafters: tuple[Drafter, ...]  # every drafter a plan may name (the engine resets them)

    def new_batch(self) -> None:
        """The planner starts serving a batch with no request running: forget everything
        per-batch (so a request alone is planned the same way every time)."""

    def reset(self, rows: list[int]) -> None:
        """New requests take these rows: forget their per-row statistics."""

    def choose(self, ctx: DraftContext) -> Plan: ...

    def observe(self, plan: Plan, num_accepted: list[int], num_drafted: list[int],
                draft_seconds: float, verify_seconds: float,
                target_sure: list[float | None] | None = None,
                last_sure: list[bool | None] | None = None) -> None:
        """The outcome of the round `plan` described (num_drafted all 0 when the drafter had
        nothing to offer and the round was a plain step); target_sure: what the round measured
        for a plan that `wants_sure` (`RoundOutcome.target_sure`), passed only when it measured
        something (a planner that never asks may leave the argument out); last_sure: whether
        a draft that stops when unsure was sure of each row's last guess
        (`Proposal.last_sure`), passed whenever such a draft drafted, whatever the planner:
        every planner's observe takes it (and may ignore it)."""
