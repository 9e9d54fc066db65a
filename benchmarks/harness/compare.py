"""Comparing two generations token for token: the exactness check every speed table carries.

Pure functions on token-id sequences; no models, no printing.
"""
from __future__ import annotations

from typing import Sequence


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where a and b differ (or where the shorter ends); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
