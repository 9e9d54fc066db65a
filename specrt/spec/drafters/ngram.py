"""Prompt-lookup drafting (vLLM's "ngram" method): guess that the text repeats itself.

For each row, find the most recent earlier occurrence of the last n committed tokens (n from
prompt_lookup_max down to prompt_lookup_min) in prompt + output, and propose the K tokens that
followed it. No model runs; the C++ index (specrt._ngram) makes a lookup O(max_n + K)
whatever the history length. Its drafts are deterministic, so for sampling q is one-hot.
"""
from __future__ import annotations

from specrt.spec.drafters.base import NO_DRAFT, DraftContext, Proposal, right_pad
from specrt.spec.drafters.ngram_index import NgramIndex

__all__ = ["COPYING", "NgramDrafter", "proposal_from_lists"]

# A match whose text has agreed with its source for this many tokens is a copy in progress
# (a passage being rewritten or quoted), and copies tend to go on: `matches` measures the
# agreement up to here, past the longest n-gram it looks up.
COPYING = 8


class NgramDrafter:
    name = "ngram"

    def __init__(self, min_n: int = 1, max_n: int = 3):
        self.min_n, self.max_n = min_n, max_n
        self.indexes: list[NgramIndex] = []

    def reset(self, rows: list[int]) -> None:
        while len(self.indexes) <= max(rows, default=-1):
            self.indexes.append(NgramIndex(self.min_n, self.max_n))
        for r in rows:
            self.indexes[r].reset()

    def matches(self, ctx: DraftContext, k: int) -> list[tuple[list[int], int]]:
        """Per row: (up to k proposed tokens, the matched length n), or ([], 0) for an
        inactive row or no match. n counts the history's last tokens that agree with the text
        the guesses are copied from: the matched n-gram's length, and past max_n up to
        COPYING. Free to compute: the adaptive planner calls this to decide whether to draft
        with a model instead, and keeps acceptance per n (a guess after a 3-token match is far
        better than one after a 1-token match, and one within a copy better still)."""
        out = []
        for index, history, active in zip(self.indexes, ctx.histories, ctx.active):
            if len(index) < len(history):
                index.extend(history[len(index):])
            out.append((index.propose(k), index.agreement(COPYING)) if active else ([], 0))
        # guesses that could add no token (past one that ends the answer, or past the
        # row's budget) are neither priced nor verified
        usable = [ctx.usable(b, guesses) for b, (guesses, _) in enumerate(out)]
        return [(u, n) if u else ([], 0) for u, (_, n) in zip(usable, out)]

    def propose(self, ctx: DraftContext, k: int) -> Proposal | None:
        return proposal_from_lists([draft for draft, _ in self.matches(ctx, k)])

    def rollback(self, num_accepted: list[int]) -> None:
        pass   # the index only ever sees committed tokens: nothing to roll back


def proposal_from_lists(drafts: list[list[int]]) -> Proposal | None:
    """Pack per-row draft lists (possibly shorter than the longest, or empty) into a one-hot
    Proposal K wide, K the longest list; None when every list is empty."""
    if not any(drafts):
        return None
    return Proposal(tokens=right_pad(drafts, NO_DRAFT), probs=None,
                    counts=[len(d) for d in drafts])
