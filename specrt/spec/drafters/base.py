"""What every drafter provides: K guesses per row, optionally with the distribution they came from.

A drafter sees the committed history of each row (prompt + accepted output, token ids only),
proposes up to K *draft tokens* per row, and is told by the round how many of them were
*accepted* (`rollback`), so it can roll its own state back. Drafters never see the target's
logits. Optional capabilities the adaptive planner reads are declared as protocols below.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, runtime_checkable

import torch

from specrt.spec.sampling import SamplingParams

NO_DRAFT = -1   # pads draft_tokens where a row proposes fewer than K tokens
LONG_CATCH_UP = 2   # a catch-up of more tokens than this runs on its row alone


def right_pad(rows: list[list[int]], fill: int = 0) -> torch.Tensor:
    """Ragged token rows -> [len(rows), longest] int64 (CPU), each row right-padded with fill."""
    out = torch.full((len(rows), max((len(r) for r in rows), default=0)), fill,
                     dtype=torch.int64)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r, dtype=torch.int64)
    return out


@dataclasses.dataclass
class Proposal:
    tokens: torch.Tensor              # [B, K] int64 draft tokens, NO_DRAFT-padded on the right
    probs: torch.Tensor | None        # [B, K, V] warped q the drafts were sampled from; None when
                                      # the drafter is deterministic (greedy or n-gram: one-hot q)
    counts: list[int]                 # [B] real drafts per row (0 for inactive rows)
    # Device work that fills `tokens` (a draft graph's replay), left to the round's device
    # section by `propose_staged`; None when the tokens are ready.
    pending: Callable[[], None] | None = None
    # [B] whether a draft that stops when unsure (`DraftModelDrafter.stop_below`) was sure of
    # each row's last guess (None for a row that drafted none); None when it never stops.
    # A round that drafted its K ended on a guess of either kind, which `auto` learns from.
    last_sure: list[bool | None] | None = None

    @property
    def k(self) -> int:
        return self.tokens.shape[1]


@dataclasses.dataclass
class DraftContext:
    histories: list[list[int]]        # [B] committed ids per row: prompt + output so far
    active: list[bool]                # [B] rows that draft this round (generating, speculating)
    params: list[SamplingParams]      # [B] how each row samples (q is warped like p)
    generators: list[torch.Generator | None]   # [B] each row's own randomness (None: greedy)
    remaining: list[int] | None = None  # [B] tokens each row may still commit (None: unknown)
    generated: list[int] | None = None  # [B] tokens each row has committed so far (None: unknown)
    ends: list[frozenset[int]] | None = None   # [B] ids that end each row's answer (its EOS
                                               # ids; None: unknown)

    def room(self, b: int, k: int) -> int:
        """How many of k guesses row b can use: one fewer than the tokens it may still
        commit. With r left, r - 1 accepted guesses and the bonus token fill them, so a guess
        past that adds no token, right or wrong (an r-th guess, right, would only take the
        bonus token's place: the same token greedy, the same distribution sampled)."""
        return k if self.remaining is None else max(0, min(k, self.remaining[b] - 1))

    def with_room(self, k: int) -> "DraftContext":
        """This context with only the active rows that have room for a guess (`room`) left
        active: a row with none sits the round out."""
        return dataclasses.replace(self, active=[a and self.room(b, k) > 0
                                                 for b, a in enumerate(self.active)])

    def ends_answer(self, b: int, token: int) -> bool:
        """Whether `token` ends row b's answer: no guess after it is ever committed (the
        answer stops there if it is accepted, and every later guess is rejected if not)."""
        return self.ends is not None and token in self.ends[b]

    def usable(self, b: int, guesses: list[int]) -> list[int]:
        """The guesses of row b that could add a token: at most `room`, and none past one
        that `ends_answer`."""
        guesses = guesses[: self.room(b, len(guesses))]
        for i, t in enumerate(guesses):
            if self.ends_answer(b, t):
                return guesses[: i + 1]
        return guesses


class Drafter(Protocol):
    name: str

    def reset(self, rows: list[int]) -> None:
        """Forget these rows: new requests take their slots."""

    def propose(self, ctx: DraftContext, k: int) -> Proposal | None:
        """Up to k draft tokens per active row, or None if no row has any."""

    def rollback(self, num_accepted: list[int]) -> None:
        """Called by the round after verifying this drafter's proposal: row b kept the first
        num_accepted[b] of its drafts; state past them (cached K/V) must be dropped."""


@runtime_checkable
class StagedDrafter(Protocol):
    """A drafter whose proposal can leave its device work (a graph replay) to the round, so
    drafting and verifying run back to back with no host sync between them."""

    name: str

    def propose_staged(self, ctx: DraftContext, k: int) -> Proposal | None:
        """As `propose`; the proposal's `pending`, when set, must run before its tokens are
        read."""


@runtime_checkable
class MatchingDrafter(Protocol):
    """A drafter that can show its guesses for free before being asked (prompt lookup): the
    adaptive planner compares them with a model's, and keeps acceptance per match length."""

    name: str
    min_n: int
    max_n: int

    def matches(self, ctx: DraftContext, k: int) -> list[tuple[list[int], int]]:
        """Per row: (up to k guesses, the matched length n), ([], 0) for none. n counts the
        history's last tokens that agree with the text the guesses come from (at least
        min_n; past max_n only for a copy in progress)."""


@runtime_checkable
class CatchUpDrafter(Protocol):
    """A drafter whose first forward of a round must first read the committed tokens it has
    not seen (a draft model): that forward's cost depends on how many."""

    name: str
    cut_short: bool     # a row's round stops at the guesses that could add a token
                        # (`DraftContext.usable`); False: every active row drafts all K (a
                        # static loop, which cannot stop on a value it has not read back)

    def lags(self, ctx: DraftContext) -> list[int]:
        """[B] committed tokens each active row has not fed the drafter yet (0: inactive).
        Rows more than LONG_CATCH_UP behind catch up alone, all but their last token, before
        the round's batched first forward."""
