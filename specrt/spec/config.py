"""`SpecConfig`: how a request speculates, with vLLM's `--speculative-config` keys.

It validates itself on construction, so a bad K or method fails here with a message naming the
value and the fix. This module knows nothing about tensors, models or drafters.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from specrt.errors import ConfigError

SPEC_METHODS = ("draft_model", "ngram", "auto")
_SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min",
              "prompt_lookup_max")
MAX_SPECULATIVE_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings, with vLLM's `--speculative-config` keys and meanings.

    method: "draft_model" (a small model with the same tokenizer), "ngram" (prompt lookup) or
    "auto" (choose drafter and K each round). num_speculative_tokens is K (for "auto": the
    largest K it may choose).
    """

    method: str = "draft_model"
    num_speculative_tokens: int = 4
    model: str | None = None
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 3

    def __post_init__(self):
        if self.method not in SPEC_METHODS:
            raise ConfigError(f"speculative method {self.method!r} is not known; "
                              f"choose one of {', '.join(SPEC_METHODS)}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"num_speculative_tokens (K) must be an integer in "
                              f"1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not (isinstance(lo, int) and isinstance(hi, int)) or lo < 1 or hi < lo:
            raise ConfigError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, "
                              f"got {lo!r} and {hi!r}")

    @classmethod
    def parse(cls, value: "SpecConfig | Mapping[str, Any] | str | None") -> "SpecConfig | None":
        """Accept a SpecConfig, a dict with vLLM's keys, or its JSON text."""
        if value is None or isinstance(value, SpecConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ConfigError(f"speculative config is not valid JSON ({e}); example: "
                                  '\'{"method": "ngram", "num_speculative_tokens": 4}\'') from None
        if not isinstance(value, Mapping):
            raise ConfigError(f"speculative config must be a JSON object, got {value!r}")
        unknown = sorted(set(value) - set(_SPEC_KEYS))
        if unknown:
            raise ConfigError(f"unknown speculative config key(s) {unknown}; "
                              f"allowed: {', '.join(_SPEC_KEYS)}")
        return cls(**value)
