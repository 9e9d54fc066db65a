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
    verify: list[float]           # [R] seconds of a target pass over r = index + 1 new tokens
    draft: list[float]            # [R] the same for the draft model ([] if none)
    chunk_rows: int = 0           # the backend's batch-invariant pass size: a batch of more
                                  # tokens runs in chunks of whole requests (0: one pass)

    @classmethod
    def calibrate(cls, target: Transformer, draft: Transformer | None, max_k: int) -> "CostModel":
        chunk = target.backend.batch_invariant_tokens
        rows = max(max_k + 1, chunk)
        verify = forward_seconds(target, rows)
        return cls(verify=verify, chunk_rows=chunk,
                   draft=forward_seconds(draft, rows) if draft is not None else [])

    @property
    def draft_step(self) -> float:
        """Seconds of one draft-model decode step of one request (0 without a draft model)."""
        return self.draft_seconds(1)

    def verify_seconds(self, t: int, batch: int = 1) -> float:
        """A target pass of t new tokens for each of `batch` requests."""
        return _pass(self.verify, t, batch, self.chunk_rows)

    def draft_seconds(self, t: int, batch: int = 1) -> float:
        """One draft forward of t tokens per request (a catch-up on committed tokens it has
        not seen, or with t = 1 a decode step)."""
        return _pass(self.draft, t, batch, self.chunk_rows) if self.draft else 0.0


def _pass(curve: list[float], t: int, batch: int, chunk: int) -> float:
    """A pass over batch x t tokens: one pass, or chunks of whole requests of at most `chunk`
    tokens each (every chunk streams the weights again)."""
    if not chunk or batch * t <= chunk or t > chunk:
        return _at(curve, batch * t)
    per = chunk // t                                  # requests per chunk
    full, rest = divmod(batch, per)
    return full * _at(curve, per * t) + (_at(curve, rest * t) if rest else 0.0)


def _at(curve: list[float], t: int) -> float:
    """curve[t - 1], extended linearly past its end (a forward's cost grows ~linearly in T)."""
    if t <= len(curve):
        return curve[t - 1]
    slope = (curve[-1] - curve[0]) / (len(curve) - 1) if len(curve) > 1 else curve[0]
    return curve[-1] + slope * (t - len(curve))
