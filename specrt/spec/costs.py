"""What a round costs: c_verify(T) for the target and c_draft(T) for the draft model.

Built from calibrated forward times (`specrt.spec.calibration`) and used as they are: the
adaptive planner's plans depend on the request and these costs, never on how long this run's
rounds took. A pass is priced by the tokens each row really computes (rows are packed, so a row
without drafts costs one token), in the chunks the backend would split it into.
"""
from __future__ import annotations

import dataclasses

from specrt.model.backends.base import chunks
from specrt.model.transformer import Transformer
from specrt.spec.calibration import timed_together


# With a draft model the curves are timed up to this many tokens: the draft reads a request's
# whole prompt before its first guess, and `auto` weighs that against the answer. Extended from
# 32 tokens at the slope from 1 to 32, the int8 draft's 252-token prompt was priced at 1.89
# target steps on a Xeon with AMX, where it took ~2.9 (benchmarks/RESULTS.md, "AMX for the int8
# draft's prompt").
PROMPT_ROWS = 128


@dataclasses.dataclass
class CostModel:
    verify: list[float]           # [R] seconds of a target pass over r = index + 1 new tokens
    draft: list[float]            # [R] the same for the draft model ([] if none)
    chunk_rows: int = 0           # the backend's batch-invariant pass size: a batch of more
                                  # tokens runs in chunks of whole rows (0: one pass)

    @classmethod
    def calibrate(cls, target: Transformer, draft: Transformer | None, max_k: int,
                  graphed: bool = False) -> "CostModel":
        """graphed: an engine with graphs; its passes are timed as its rounds run them."""
        chunk = target.backend.batch_invariant_tokens
        rows = max(max_k + 1, chunk, PROMPT_ROWS if draft is not None else 0)
        # Timed together: what auto weighs is the draft's cost against the target's.
        curves = timed_together([target] if draft is None else [target, draft], rows, graphed)
        return cls(verify=curves[0], draft=curves[1] if draft is not None else [],
                   chunk_rows=chunk)

    def verify_pass(self, tokens: list[int]) -> float:
        """A target pass over tokens[b] new tokens of each row b (0: the row sits it out)."""
        return _pass(self.verify, tokens, self.chunk_rows)

    def draft_pass(self, tokens: list[int]) -> float:
        """A draft-model forward of tokens[b] tokens of each row (a catch-up on committed
        tokens it has not seen, or with 1 a decode step); 0 without a draft model."""
        return _pass(self.draft, tokens, self.chunk_rows) if self.draft else 0.0

    def verify_seconds(self, t: int, batch: int = 1) -> float:
        """A target pass of t new tokens for each of `batch` requests."""
        return self.verify_pass([t] * batch)


def _pass(curve: list[float], tokens: list[int], chunk: int) -> float:
    """A pass over the rows' tokens, packed: one pass, or chunks of whole rows of at most
    `chunk` tokens each (`specrt.model.backends.base.chunks`; every chunk streams the weights
    again). A row longer than `chunk` (a prefill) takes one pass for all."""
    if not chunk or max(tokens, default=0) > chunk:
        return _at(curve, sum(tokens))
    return sum(_at(curve, o1 - o0) for _, _, o0, o1 in chunks(tokens, chunk) if o1 > o0)


def _at(curve: list[float], t: int) -> float:
    """curve[t - 1], extended linearly past its end at the slope of its last token (the
    widest timed passes' cost per token; from the first point instead, the cheap tokens of
    narrow passes priced a prompt of hundreds); nothing for no tokens."""
    if t <= 0:
        return 0.0
    if t <= len(curve):
        return curve[t - 1]
    slope = curve[-1] - curve[-2] if len(curve) > 1 else curve[0]
    return curve[-1] + max(slope, 0.0) * (t - len(curve))
