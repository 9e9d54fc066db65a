"""What a round costs: c_verify(T) for the target and c_draft(T) for the draft model.

Built from calibrated forward times (`specrt.spec.calibration`). The adaptive planner scales
these by online ratios (measured / calibrated), so a machine that gets busier or quieter moves
every estimate together.
"""
from __future__ import annotations

import dataclasses

from specrt.model.transformer import Transformer
from specrt.spec.calibration import forward_seconds


@dataclasses.dataclass
class CostModel:
    verify: list[float]           # [K_max + 1] seconds of a target pass over T = index + 1 tokens
    draft: list[float]            # [K_max + 1] the same for the draft model ([] if none)

    @classmethod
    def calibrate(cls, target: Transformer, draft: Transformer | None, max_k: int) -> "CostModel":
        verify = forward_seconds(target, max_k + 1)
        return cls(verify=verify,
                   draft=forward_seconds(draft, max_k + 1) if draft is not None else [])

    @property
    def draft_step(self) -> float:
        """Seconds of one draft-model decode step (0 without a draft model)."""
        return self.draft[0] if self.draft else 0.0

    def verify_seconds(self, t: int) -> float:
        return _at(self.verify, t)

    def draft_seconds(self, t: int) -> float:
        """One draft forward over t tokens (its catch-up on committed tokens it has not seen)."""
        return _at(self.draft, t) if self.draft else 0.0


def _at(curve: list[float], t: int) -> float:
    """curve[t - 1], extended linearly past its end (a forward's cost grows ~linearly in T)."""
    if t <= len(curve):
        return curve[t - 1]
    slope = (curve[-1] - curve[0]) / (len(curve) - 1) if len(curve) > 1 else curve[0]
    return curve[-1] + slope * (t - len(curve))
