"""The fixed planner: always ask one drafter for K tokens (vLLM's behaviour)."""
from __future__ import annotations

from specrt.spec.drafters.base import DraftContext, Drafter
from specrt.spec.planners.base import Plan


class FixedPlanner:
    """Always ask `drafter` for `k` tokens. A drafter with nothing to offer (an n-gram miss)
    makes the round a plain decoding step rather than a verify pass over nothing."""

    def __init__(self, drafter: Drafter, k: int):
        self.max_k = k
        self.drafters = (drafter,)
        self._plan = Plan(drafter, k, f"{drafter.name}:{k}")

    def new_batch(self) -> None:
        pass

    def reset(self, rows: list[int]) -> None:
        pass

    def choose(self, ctx: DraftContext) -> Plan:
        return self._plan

    def observe(self, plan, num_accepted, num_drafted, draft_seconds, verify_seconds,
                target_sure=None, last_sure=None) -> None:
        pass
