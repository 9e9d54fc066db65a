"""What a request is to the engine, and what the engine reports back about it.

Token ids only: the prompt, a budget, how to sample, whether and how to speculate, which ids
end the answer. Text (chat templates, stop strings, detokenization) belongs to `specrt.api`.
"""
from __future__ import annotations

import dataclasses
import itertools

from specrt.spec.config import SpecConfig
from specrt.spec.sampling import SamplingParams

_ids = itertools.count()

# Why a request ended. "eos" (an end-of-sequence id, kept in the output) and "length" (the
# token budget) come from the engine; "cancelled" from the caller; "error" from a failure.
FINISH_REASONS = ("eos", "length", "cancelled", "error")


def new_request_id() -> str:
    return f"req-{next(_ids)}"


@dataclasses.dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]             # token ids, at least one
    max_new_tokens: int
    params: SamplingParams = SamplingParams()
    spec: SpecConfig | None = None      # None: this request takes plain steps
    eos_ids: frozenset[int] = frozenset()
    request_id: str = dataclasses.field(default_factory=new_request_id)


@dataclasses.dataclass
class Step:
    """What one round (or the prefill, index 0) committed for one request."""

    request_id: str
    index: int                          # 0: the prefill's first token; then rounds 1, 2, ...
    new_tokens: list[int]               # committed this round (EOS kept, cut at the budget)
    plan: str                           # "prefill", "plain", "draft_model:4", "ngram:3", ...
    draft_tokens: list[int]             # the drafts proposed for this request this round
    num_accepted: int
    finish_reason: str | None = None    # set on the request's last step
    stats: dict | None = None           # set on the request's last step (see engine.metrics)
    error: BaseException | None = None  # set when finish_reason == "error"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
