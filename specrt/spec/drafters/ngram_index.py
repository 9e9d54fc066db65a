"""Prompt-lookup n-gram index: the C++ matcher (specrt._ngram) when built, else pure Python.

Prompt lookup drafts by copying: if the last n tokens of the history occurred earlier, the
tokens that followed that occurrence are a good guess for what comes next. The semantics,
shared by both backends and checked against a brute-force reference in tests/test_ngram.py:

    propose(history, k, min_n, max_n): for n from max_n down to min_n, if len(history) > n,
    find the most recent start i < len(history) - n with history[i:i+n] == history[-n:];
    if found, return history[i+n : i+n+k] (possibly shorter than k, never empty).
    If no n matches, return [].

Public API, identical for both backends:
    BACKEND                      "cpp" or "python": which one NgramIndex/propose are.
    NgramIndex(min_n, max_n)     incremental index: extend(tokens), propose(k) -> list[int],
                                 match_length(), agreement(limit), reset(), len();
                                 propose is O(max_n + k), flat in history length.
    propose(history, k, min_n, max_n) -> list[int]   stateless, O(len(history) * max_n).
    PyNgramIndex, py_propose     the pure-Python fallback, always importable (for tests).

Tokens may be a list/tuple of ints or a 1-D integer array (numpy, CPU torch tensor, anything
numpy.asarray accepts). Bad arguments raise ValueError with the same message in both
backends; the C++ side mirrors the helpers below word for word.

This module knows token ids only: no models, no tokenizer, no torch import. The drafter that
uses it lives in specrt/spec/drafters/ngram.py.
"""
from __future__ import annotations

import operator

import numpy as np

MAX_TOKEN = 2**31 - 1  # token ids are stored as int32 by the C++ index
MAX_NGRAM = 1024       # the longest n-gram an index keeps (one table each, made up front)
_TOKEN_RANGE = f"token ids must be integers in [0, {MAX_TOKEN}]"


def check_k(k: int) -> int:
    """k as an int; ValueError unless k >= 1 (TypeError if it is not an integer at all)."""
    if k.__class__ is not int:
        k = operator.index(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return k


def check_ngram_sizes(min_n: int, max_n: int) -> tuple[int, int]:
    """(min_n, max_n) as ints; ValueError unless 1 <= min_n <= max_n <= MAX_NGRAM (longer
    n-grams never match in text, and their tables would take memory by the gigabyte)."""
    min_n, max_n = operator.index(min_n), operator.index(max_n)
    if min_n < 1:
        raise ValueError(f"min_n must be >= 1, got {min_n}")
    if min_n > max_n:
        raise ValueError(f"min_n must be <= max_n, got min_n={min_n}, max_n={max_n}")
    if max_n > MAX_NGRAM:
        raise ValueError(f"max_n must be <= {MAX_NGRAM}, got {max_n}")
    return min_n, max_n


def as_token_list(tokens) -> list[int]:
    """Validated token ids as a list of int; ValueError naming the first bad token.

    The common cases are checked without Python bytecode per token: a list of ints by the
    builtin min/max over it, an array by numpy. Only a list holding something other than
    ints takes the per-token path, which finds the first offender as the C++ binding does.
    """
    if isinstance(tokens, (list, tuple)):
        if not tokens:
            return []
        if set(map(type, tokens)) == {int} and min(tokens) >= 0 and max(tokens) <= MAX_TOKEN:
            return list(tokens)
        return _check_each(tokens)
    arr = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"tokens must be a list, tuple or 1-D array of token ids, "
                         f"got a {arr.ndim}-D {type(tokens).__name__}")
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{_TOKEN_RANGE}, got an array of dtype {arr.dtype}")
    if arr.size:
        bad = (arr < 0) | (arr > MAX_TOKEN)
        if bad.any():
            i = int(bad.argmax())
            raise ValueError(f"{_TOKEN_RANGE}, got {int(arr[i])} at index {i}")
    return arr.tolist()


def _check_each(tokens) -> list[int]:
    out = []
    for i, token in enumerate(tokens):
        # bool is an int subclass, but True as a token id is almost surely a bug upstream.
        if isinstance(token, bool):
            raise ValueError(f"{_TOKEN_RANGE}, got {token!r} of type bool at index {i}")
        try:
            value = operator.index(token)  # ints and numpy integer scalars; not floats
        except TypeError:
            raise ValueError(f"{_TOKEN_RANGE}, got {token!r} of type "
                             f"{type(token).__name__} at index {i}") from None
        if not 0 <= value <= MAX_TOKEN:
            raise ValueError(f"{_TOKEN_RANGE}, got {value} at index {i}")
        out.append(value)
    return out


class PyNgramIndex:
    """Pure-Python incremental index with the same API and results as the C++ NgramIndex.

    For each n in [min_n, max_n] a dict maps every n-gram (as a tuple) to the end position of
    its latest occurrence. Appending a token looks up the n-gram ending there before
    overwriting it, which gives the previous occurrence of the current suffix; propose only
    reads those, so it is O(max_n + k). Memory is a few hundred bytes per token and level.
    """

    __slots__ = ("min_n", "max_n", "_tokens", "_last_end", "_prev_end")

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = check_ngram_sizes(min_n, max_n)
        self.reset()

    def reset(self) -> None:
        """Forget the whole history."""
        levels = self.max_n - self.min_n + 1
        self._tokens: list[int] = []
        self._last_end: list[dict[tuple[int, ...], int]] = [{} for _ in range(levels)]
        # [levels] previous end position of the current suffix n-gram, -1 if none
        self._prev_end = [-1] * levels

    def extend(self, tokens) -> None:
        """Append committed tokens; on a bad token raise ValueError and append nothing."""
        history = self._tokens
        last_end, prev_end, min_n = self._last_end, self._prev_end, self.min_n
        sizes = range(min_n, self.max_n + 1)
        for token in as_token_list(tokens):
            history.append(token)
            length = len(history)
            for n in sizes:
                level = n - min_n
                if n > length:
                    prev_end[level:] = [-1] * (len(prev_end) - level)
                    break
                key = tuple(history[length - n:])
                table = last_end[level]
                prev_end[level] = table.get(key, -1)
                table[key] = length - 1

    def match_length(self) -> int:
        """The suffix length n that propose matches on (the longest n in [min_n, max_n]
        whose last n tokens occurred earlier); 0 if none does."""
        for level in range(len(self._prev_end) - 1, -1, -1):  # longest n first
            if self._prev_end[level] >= 0:
                return self.min_n + level
        return 0

    def agreement(self, limit: int) -> int:
        """How many tokens, up to limit, the history's suffix shares with the text ending
        where propose copies from: match_length() below max_n, possibly more once the whole
        max_n-gram matches; 0 if nothing matches (or limit <= 0). A long agreement means the
        text is being copied, so the copy is likely to go on."""
        limit = operator.index(limit)
        n = self.match_length()
        if not n or limit <= 0:
            return 0
        end, history = self._prev_end[n - self.min_n], self._tokens
        last, j = len(history) - 1, 0
        while j < min(limit, end + 1) and history[end - j] == history[last - j]:
            j += 1
        return j

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the most recent earlier occurrence of the longest
        matching suffix n-gram; [] if none matches."""
        k = check_k(k)
        n = self.match_length()
        if not n:
            return []
        end = self._prev_end[n - self.min_n]
        return self._tokens[end + 1:end + 1 + k]

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"PyNgramIndex(min_n={self.min_n}, max_n={self.max_n}, len={len(self)})"


def py_propose(history, k: int, min_n: int, max_n: int) -> list[int]:
    """Pure-Python stateless matcher: a direct backward scan, same results as propose."""
    k = check_k(k)
    min_n, max_n = check_ngram_sizes(min_n, max_n)
    history = as_token_list(history)
    length = len(history)
    for n in range(max_n, min_n - 1, -1):
        if length <= n:
            continue
        suffix = history[-n:]
        last = suffix[-1]
        # Scan candidate end positions, most recent first; comparing one token before the
        # whole slice keeps the scan cheap when matches are rare.
        for end in range(length - 2, n - 2, -1):
            if history[end] == last and history[end - n + 1:end + 1] == suffix:
                return history[end + 1:end + 1 + k]
    return []


try:
    from specrt import _ngram
except ImportError as exc:
    from specrt.logs import extension_missing

    extension_missing("specrt._ngram", "the C++ n-gram matcher", "the slower pure-Python "
                      "fallback", exc)
    BACKEND = "python"
    NgramIndex = PyNgramIndex
    propose = py_propose
else:
    BACKEND = "cpp"
    NgramIndex = _ngram.NgramIndex
    propose = _ngram.propose

__all__ = ["BACKEND", "MAX_NGRAM", "MAX_TOKEN", "NgramIndex", "PyNgramIndex", "propose",
           "py_propose"]
