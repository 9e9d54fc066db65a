"""Per-request counters, with vLLM's definitions so numbers compare directly.

- num_drafts: rounds in which the row received at least one draft token
- num_draft_tokens / num_accepted_tokens: drafts proposed / accepted
- accepted_per_position[i]: rounds whose draft at position i was accepted
- acceptance_rate = num_accepted_tokens / num_draft_tokens
- mean_acceptance_length = 1 + num_accepted_tokens / num_drafts (tokens per drafted round)

Acceptance is the verify pass's verdict, as in vLLM: a draft accepted past an EOS or past the
token budget counts as accepted although the answer ends before it (new_tokens counts only
what was committed).
"""
from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class RequestStats:
    new_tokens: int = 0
    target_passes: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = dataclasses.field(default_factory=list)
    plan_histogram: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def record_round(self, drafted: int, accepted: int, plan: str) -> None:
        self.target_passes += 1
        self.plan_histogram[plan] += 1
        if drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        if len(self.accepted_per_position) < drafted:
            self.accepted_per_position += [0] * (drafted - len(self.accepted_per_position))
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def as_dict(self, timing: "Timing", num_speculative_tokens: int = 0) -> dict:
        per_pos = self.accepted_per_position + [0] * max(
            0, num_speculative_tokens - len(self.accepted_per_position))
        seconds = timing.total
        return {
            "new_tokens": self.new_tokens,
            "seconds": seconds,
            "tokens_per_second": self.new_tokens / seconds if seconds > 0 else 0.0,
            "target_passes": self.target_passes,
            "tokens_per_target_pass": (self.new_tokens / self.target_passes
                                       if self.target_passes else 0.0),
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": per_pos,
            "acceptance_rate": (self.num_accepted_tokens / self.num_draft_tokens
                                if self.num_draft_tokens else 0.0),
            "mean_acceptance_length": (1 + self.num_accepted_tokens / self.num_drafts
                                       if self.num_drafts else 1.0),
            "plan_histogram": dict(sorted(self.plan_histogram.items())),
            "prefill_seconds": timing.prefill,
            "draft_seconds": timing.draft,
            "verify_seconds": timing.verify,
            "other_seconds": max(0.0, seconds - timing.prefill - timing.draft - timing.verify),
            "queued_seconds": timing.queued,
        }


def with_new_tokens(stats: dict, new_tokens: int) -> dict:
    """A request's stats (`RequestStats.as_dict`) with `new_tokens` replaced, and the rates
    derived from it recomputed, e.g. for a stop string that cut the answer short."""
    seconds, passes = stats["seconds"], stats["target_passes"]
    return dict(stats, new_tokens=new_tokens,
                tokens_per_second=new_tokens / seconds if seconds > 0 else 0.0,
                tokens_per_target_pass=new_tokens / passes if passes else 0.0)


@dataclasses.dataclass
class Timing:
    """Wall time of one request from its admission, split by phase (a round's draft and verify
    time counts fully for every request that took part in it)."""

    total: float = 0.0
    prefill: float = 0.0
    draft: float = 0.0
    verify: float = 0.0
    queued: float = 0.0                # waiting for a slot before admission
