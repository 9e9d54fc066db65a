"""`SpecConfig`: how a request speculates, with vLLM's `--speculative-config` keys.

It validates itself on construction, so a bad K or method fails here with a message naming the
value and the fix. This module knows nothing about tensors, models or drafters.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from specrt.errors import ArgumentError
from specrt.checks import check_int, check_number, show

SPEC_METHODS = ("draft_model", "ngram", "auto")
PROMPT_LOOKUP_MIN, PROMPT_LOOKUP_MAX = 1, 3     # vLLM's defaults: match 1..3 prompt tokens
_SPEC_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min",
              "prompt_lookup_max")
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 64      # n-gram lengths; longer ones never match and cost a scan each
NEEDS_DRAFT = ("speculative method 'draft_model' needs a draft model: pass LLM(draft=DIR), "
               "--draft DIR, or \"model\" in the speculative config")
# The draft model stops a row's drafting after a guess it gives a probability below this (its
# softmax over the ids it scores, at temperature 1; specrt.spec.drafters.draft_model). Such a
# guess is the one most likely rejected, and the guesses after it more so, while one it is
# sure of is usually right (benchmarks/RESULTS.md, "The draft model stops when unsure").
DRAFT_STOP = 0.5


def check_draft_stop(value) -> float:
    """A draft stop (a probability) -> float, or one clear error naming the fix."""
    return check_number("draft_stop", value, 0.0, 1.0,
                        fix=f"the draft's probability below which it stops a round's drafts "
                            f"({DRAFT_STOP}; 0 never stops on it)")


def means_plain(flag: str) -> bool:
    """Whether a `--speculative-config` value asks for plain decoding (both CLIs' flag)."""
    return flag.strip().lower() in ("none", "null", "off")


@dataclasses.dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding settings, with vLLM's `--speculative-config` keys and meanings.

    method: "draft_model" (a small model with the same tokenizer), "ngram" (prompt lookup) or
    "auto" (choose drafter and K each round). num_speculative_tokens is K (for "auto": the
    largest K it may choose; default 4, for "auto" 16, so a long prompt-lookup match that
    keeps being accepted can be drafted whole).
    """

    method: str = "draft_model"
    num_speculative_tokens: int | None = None
    model: str | None = None
    prompt_lookup_min: int = PROMPT_LOOKUP_MIN
    prompt_lookup_max: int = PROMPT_LOOKUP_MAX

    def __post_init__(self):
        if not isinstance(self.method, str) or self.method not in SPEC_METHODS:
            raise ArgumentError(f"speculative method {show(self.method)} is not known; "
                                f"choose one of {', '.join(SPEC_METHODS)}")
        if self.num_speculative_tokens is None:
            object.__setattr__(self, "num_speculative_tokens",
                               MAX_SPECULATIVE_TOKENS if self.method == "auto" else 4)
        object.__setattr__(self, "num_speculative_tokens", check_int(
            "num_speculative_tokens (K)", self.num_speculative_tokens, 1,
            MAX_SPECULATIVE_TOKENS, fix="4 is a good start"))
        if isinstance(self.model, os.PathLike):         # as LLM(draft=Path(...)) takes it
            object.__setattr__(self, "model", os.fspath(self.model))
        if self.model is not None and (not isinstance(self.model, str) or not self.model.strip()
                                       or "\0" in self.model):
            raise ArgumentError(f"speculative \"model\" must be a draft model directory or known "
                                f"name (a non-empty string), got {show(self.model)}")
        if self.model is not None and self.method == "ngram":
            # it would load a draft model that prompt lookup never runs
            raise ArgumentError("speculative \"model\" names a draft model, and method 'ngram' "
                                "drafts from the prompt with none: drop \"model\", or use "
                                "method 'draft_model' or 'auto'")
        lo = check_int("prompt_lookup_min", self.prompt_lookup_min, 1, MAX_PROMPT_LOOKUP)
        hi = check_int("prompt_lookup_max", self.prompt_lookup_max, 1, MAX_PROMPT_LOOKUP)
        if hi < lo:
            raise ArgumentError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, "
                                f"got {lo!r} and {hi!r}")
        if self.method == "draft_model" and (lo, hi) != (PROMPT_LOOKUP_MIN, PROMPT_LOOKUP_MAX):
            # as "model" with ngram: a setting of a drafter this method never runs
            raise ArgumentError("prompt_lookup_min / prompt_lookup_max tune prompt lookup, "
                                "which method 'draft_model' does not run: drop them, or use "
                                "method 'ngram' or 'auto'")
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)

    @classmethod
    def parse(cls, value: "SpecConfig | Mapping[str, Any] | str | None") -> "SpecConfig | None":
        """Accept a SpecConfig, a dict with vLLM's keys, or its JSON text; None, or the
        CLIs' word for plain decoding ("none", `means_plain`), is None: no speculation."""
        if value is None or isinstance(value, SpecConfig):
            return value
        if isinstance(value, str) and means_plain(value):
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (ValueError, RecursionError) as e:   # ValueError: JSONDecodeError, and
                                                        # an integer of over 4300 digits
                raise ArgumentError(f"speculative config is not valid JSON ({str(e)[:80]}); "
                                    'example: \'{"method": "ngram", "num_speculative_tokens": '
                                    "4}'") from None
        if not isinstance(value, Mapping):
            raise ArgumentError(f"speculative config must be a JSON object (a dict), got "
                                f"{show(value)}")
        unknown = sorted(show(k) for k in value if k not in _SPEC_KEYS)
        if unknown:
            raise ArgumentError(f"unknown speculative config key(s) {', '.join(unknown)}; "
                                f"allowed: {', '.join(_SPEC_KEYS)}")
        return cls(**value)
