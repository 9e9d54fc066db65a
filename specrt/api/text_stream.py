"""Incremental detokenization for streaming: a growing list of ids -> text deltas that never
split a multi-byte character and never show text past a stop string.

Each push costs time bounded by the push, not by the text so far: the ids are decoded as a
settled head (decoded once) and a short window behind it (decoded again per token or per push).
The window's first ids move into the head only where decoding the two parts apart gives the
same text as decoding them together, with `_CONTEXT` ids of right context; for byte-level BPE
(Qwen2's) that is every character boundary, for a decoder that strips a leading space
(SentencePiece's) every id that does not start with one. A split is tried at four places; where
none is safe the window grows until one is: slower, never different from decoding at once.

The text's last characters that later tokens may still change are never shown or taken as a
stop string's end until they settle (`_unsettled`): the U+FFFD placeholders of a character whose
bytes have not all arrived, and, for a byte-fallback decoder (SentencePiece models), all that a
trailing run of byte tokens decodes to, since it decodes a run as a whole (one bad byte turns
all of it into U+FFFD); no split is made inside such a run.
"""
from __future__ import annotations

from specrt.api.tokenizer import Tokenizer
from specrt.errors import SpecrtError

_CONTEXT = 8        # ids kept in the window behind a split, as its right context
_SETTLE_AT = 32     # window length (ids) at which a split is tried


def unfinished(text: str) -> int:
    """How many of the text's last characters may be placeholders (U+FFFD) of a character
    whose bytes have not all arrived: byte-level BPE shows one for the bytes so far, a byte
    fallback decoder (SentencePiece models') one per byte, so up to 3."""
    return min(3, len(text) - len(text.rstrip("\ufffd")))


def _borders(s: str) -> list[int]:
    """KMP's failure function of s: for each i, the length of the longest proper prefix of
    s[:i + 1] that is also its suffix."""
    out, k = [0] * len(s), 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = out[k - 1]
        if s[i] == s[k]:
            k += 1
        out[i] = k
    return out


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
        # characters before the end of the text that a stop string completed by the next
        # token may start at: its length, and 3 for a character still unfinished ("\ufffd")
        self._reach = max(map(len, self.stop), default=1) + 3
        self.ids: list[int] = []
        self.emitted = 0        # characters of the text already returned
        self.stopped = False
        self.stop_token_count: int | None = None   # ids up to the one completing the stop
                                                   # string (its tokens counted, as vLLM does)
        self._head: list[str] = []   # the settled text, decode(ids[:_base]), in pieces
        self._base = 0
        self._tail = ""              # decode(ids[_base:])
        self._recent = ""            # the settled text from offset _recent_at on: what is
        self._recent_at = 0          # not yet shown or a stop string may still reach into
        self._settle_at = _SETTLE_AT
        self._final: str | None = None
        # {(offset, end, stop): ids} of the stop strings in the text while the first of them
        # ends in text later tokens may still change (`_unsettled`). The first stops the text
        # once later tokens (or the end) leave it in place; each match's ids count up to the
        # token that first completed it.
        self._pending: dict[tuple[int, int, str], int] = {}
        # a byte-fallback decoder's byte tokens ("<0xE4>"), and how many of the text's last
        # characters later tokens may still change (`_unsettled`)
        self._bytes: frozenset[int] = tokenizer.byte_ids() if hasattr(tokenizer, "byte_ids") \
            else frozenset()
        self._open = 0
        # Per stop string, the longest of its proper prefixes the settled text ends with (a
        # KMP automaton fed each settled character once, `_held`), and up to which offset the
        # text was fed: the text a stop string may still grow from, found in time per push
        # bounded by the characters the push settled. Tried at every length instead, 256 stop
        # strings of 2,000 characters took a server's event loop for ~30 s of a 2,000-token
        # answer.
        self._borders = [_borders(s) for s in self.stop]
        self._matched = [0] * len(self.stop)
        self._fed = 0

    @property
    def text(self) -> str:
        """The text so far (cut before the stop string once stopped)."""
        if self._final is not None:
            return self._final
        return "".join(self._head) + self._tail

    def push(self, ids: list[int], final: bool = False) -> str:
        if self.tokenizer is None or self.stopped:
            self.ids += ids
            return ""
        if not self.stop:
            self.ids += ids
            self._decode_window()
            return self._release(final)
        for i, t in enumerate(ids):   # one by one: a stop string is cut at the token completing it
            settled = self._length() - self._open
            self.ids.append(t)
            self._decode_window()
            hits = self._find_stops(settled)
            self._pending = {h: self._pending.get(h, len(self.ids)) for h in hits}
            if not hits:
                continue
            first = min(hits)
            if first[1] > self._length() - self._open and not (final and i == len(ids) - 1):
                continue                           # its end may yet become other text
            return self._stop(first)
        if final and self._pending:                # the end leaves the first in place
            return self._stop(min(self._pending))
        return self._release(final)

    @property
    def kept_ids(self) -> int:
        """How many of `ids` the answer keeps whatever comes next: all but those past a stop
        string (once stopped) or past the earliest one may yet end at (see `_pending`)."""
        if self.stopped:
            return self.stop_token_count
        return min(self._pending.values(), default=len(self.ids))

    def _stop(self, hit: tuple[int, int, str]) -> str:
        """Cut the text before the stop string found at hit = (offset, end, stop)."""
        self._final = self.text[:hit[0]]
        self.stopped = True
        self.stop_token_count = self._pending.get(hit, len(self.ids))
        self._pending = {}
        return self._release(final=True)

    # --- the window ---------------------------------------------------------------------------
    def _length(self) -> int:
        return self._recent_at + len(self._recent) + len(self._tail)

    def _decode_window(self) -> None:
        window = self.ids[self._base:]
        self._tail = self.tokenizer.decode(window)
        if len(window) >= self._settle_at and not self._settle(window):
            self._settle_at = 2 * len(window)        # not splittable here: try again later
        self._open = self._unsettled()

    def _unsettled(self) -> int:
        """How many of the text's last characters later tokens may still change: the
        placeholders of an unfinished character (`unfinished`) or, for a byte-fallback
        decoder, all a trailing run of byte tokens decodes to (it decodes the run as a whole:
        one bad byte, a character cut at the end included, turns all of it into U+FFFD)."""
        n = unfinished(self._tail)
        window = self.ids[self._base:]
        run = 0
        while run < len(window) and window[-1 - run] in self._bytes:
            run += 1
        if run:
            n = max(n, len(self._tail) - len(self.tokenizer.decode(window[:-run])))
        return n

    def _settle(self, window: list[int]) -> bool:
        """Move the window's first ids into the head where that changes no text."""
        for k in range(len(window) - _CONTEXT, len(window) - _CONTEXT - 4, -1):
            if window[k - 1] in self._bytes and window[k] in self._bytes:
                continue                             # inside a run of byte tokens
            head = self.tokenizer.decode(window[:k])
            if not self._tail.startswith(head):
                continue                             # inside a character: one id back
            if self.tokenizer.decode(window[k:]) != self._tail[len(head):]:
                continue                             # not local here (e.g. a stripped space)
            self._head.append(head)
            self._recent += head
            self._tail = self._tail[len(head):]
            self._base += k
            self._settle_at = _SETTLE_AT
            self._forget()
            return True
        return False

    def _forget(self) -> None:
        """Drop the settled text that is shown and out of a stop string's reach."""
        keep_from = min(self.emitted, self._length() - self._reach)
        cut = min(keep_from - self._recent_at, len(self._recent))
        if cut > 0:
            self._recent = self._recent[cut:]
            self._recent_at += cut

    def _find_stops(self, searched: int) -> list[tuple[int, int, str]]:
        """(offset, end, stop) in the text for each stop string's first place ending past
        `searched` characters."""
        recent = self._recent + self._tail
        start = max(searched - self._reach, self._recent_at) - self._recent_at
        return [(self._recent_at + i, self._recent_at + i + len(s), s)
                for s in self.stop for i in (recent.find(s, start),) if i >= 0]

    # --- what may be shown --------------------------------------------------------------------
    def _release(self, final: bool) -> str:
        if self._final is not None:
            recent, at = self._final[self.emitted:], self.emitted
        else:
            recent, at = self._recent + self._tail, self._recent_at
        end = len(recent)
        if not final and self._final is None:
            end -= self._open                      # text later tokens may yet change
            end -= self._held(recent, at, end)     # a suffix that may grow into a stop string
        if self._pending:                          # stop strings that may be real
            end = min(end, min(self._pending)[0] - at)
        end = max(at + end, self.emitted)
        delta = recent[self.emitted - at:end - at]
        self.emitted = end
        if self._final is None:
            self._forget()
        return delta

    def _held(self, recent: str, at: int, end: int) -> int:
        """How many of the settled text's last characters (recent[:end], recent starting at
        offset `at`) are the longest proper prefix of a stop string they end with: text that
        may yet grow into one. Each stop string's automaton reads the characters settled
        since the last call (settled text does not change; were it ever to end before them,
        it is read again from the first character not shown, where every such prefix
        starts: one that started in shown text would have been held)."""
        if not self.stop:
            return 0
        if at + end < self._fed:
            self._matched = [0] * len(self.stop)
            self._fed = self.emitted
        new = recent[self._fed - at:end]
        self._fed = at + end
        for i, (s, border) in enumerate(zip(self.stop, self._borders)):
            q = self._matched[i]
            for c in new:
                while q and s[q] != c:
                    q = border[q - 1]
                if s[q] == c:
                    q += 1
                if q == len(s):                    # a whole stop string (`_find_stops`):
                    q = border[q - 1]              # what may grow into the next one
            self._matched[i] = q
        return max(self._matched)
