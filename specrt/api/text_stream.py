"""Incremental detokenization for streaming: a growing list of ids -> text deltas that never
split a multi-byte character and never show text past a stop string."""
from __future__ import annotations

from specrt.api.tokenizer import Tokenizer
from specrt.errors import SpecrtError


class TextStream:
    """Incremental detokenization of one row, with stop strings.

    `push(ids)` returns the text that may be shown now. Text that could still turn into a stop
    string (a suffix that is a prefix of one) or that ends in an incomplete UTF-8 sequence is
    held back until the next push. After a stop string is found, `stopped` is set and the text
    before it is final.
    """

    def __init__(self, tokenizer: Tokenizer | None, stop: list[str] | None):
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        if self.stop and tokenizer is None:
            raise SpecrtError("stop strings need a tokenizer, and this model directory has no "
                              "tokenizer.json")
        self.ids: list[int] = []
        self.text = ""          # text so far (cut before a stop string once stopped)
        self.emitted = 0        # characters of self.text already returned
        self.stopped = False
        self.stop_token_count: int | None = None   # ids needed to produce the kept text

    def push(self, ids: list[int], final: bool = False) -> str:
        if self.tokenizer is None or self.stopped:
            self.ids += ids
            return ""
        for t in ids:      # token by token, so a stop string is cut at the token completing it
            self.ids.append(t)
            if not self.stop:
                continue
            text = self.tokenizer.decode(self.ids)
            hit = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
            if hit >= 0:
                self.text = text[:hit]
                self.stopped = True
                self.stop_token_count = len(self.ids)
                return self._release(final=True)
        self.text = self.tokenizer.decode(self.ids)
        return self._release(final)

    def _release(self, final: bool) -> str:
        end = len(self.text)
        if not final:
            if self.text.endswith("\ufffd"):          # an unfinished multi-byte character
                end -= 1
            for s in self.stop:                       # a suffix that may grow into a stop string
                for n in range(min(len(s) - 1, end), 0, -1):
                    if self.text[:end].endswith(s[:n]):
                        end -= n
                        break
        end = max(end, self.emitted)
        delta = self.text[self.emitted:end]
        self.emitted = end
        return delta
