"""Alias of `specrt.spec.drafters.ngram_index` (the public import path of the n-gram index)."""
import sys

from specrt.spec.drafters import ngram_index as _impl

sys.modules[__name__] = _impl
