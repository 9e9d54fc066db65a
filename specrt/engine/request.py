"""What a request is to the engine, and what the engine reports back about it.

Token ids only: the prompt, a budget, how to sample, whether and how to speculate, which ids
end the answer. Text (chat templates, stop strings, detokenization) belongs to `specrt.api`.
"""
from __future__ import annotations

import dataclasses
import itertools

from specrt.errors import CapacityError, ConfigError, SpecrtError
from specrt.spec.config import NEEDS_DRAFT, SpecConfig
from specrt.spec.sampling import SamplingParams

_ids = itertools.count()


def new_request_id() -> str:
    return f"req-{next(_ids)}"


@dataclasses.dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]             # token ids, at least one
    max_new_tokens: int
    params: SamplingParams = SamplingParams()
    spec: SpecConfig | None = None      # None: this request takes plain steps
    eos_ids: frozenset[int] = frozenset()
    request_id: str = dataclasses.field(default_factory=new_request_id)


def runs_alone(request: Request) -> bool:
    """Whether `request` must have the batch to itself: a seeded sampled request under `auto`.
    auto plans each round for the batch as a whole (one drafter, one K, priced for every row),
    so beside companions its rounds, and with them the random draws a seeded request consumes,
    would differ from its run alone; greedy output and fixed methods are the same in any batch.
    It waits for the running requests to finish and nothing joins it while it runs."""
    return (request.spec is not None and request.spec.method == "auto"
            and not request.params.greedy and request.params.seed is not None)


@dataclasses.dataclass
class Step:
    """What one round (or the prefill, index 0) committed for one request."""

    request_id: str
    index: int                          # 0: the prefill's first token; then rounds 1, 2, ...
    new_tokens: list[int]               # committed this round (EOS kept, cut at the budget)
    plan: str                           # "prefill", "plain", "draft_model:4", "ngram:3", ...
    draft_tokens: list[int]             # the drafts proposed for this request this round
    num_accepted: int
    finish_reason: str | None = None    # set on the request's last step: "eos" (an
                                        # end-of-sequence id, kept) or "length" (the budget)
                                        # from the engine, "cancelled" from the caller,
                                        # "error" from a failure
    stats: dict | None = None           # set on the request's last step (see engine.metrics)
    error: BaseException | None = None  # set when finish_reason == "error"
    delivered: float = 0.0              # time.perf_counter() when handed to its request (the
                                        # engine's time of the step, whenever it is read)
    scheduled: float = 0.0              # the prefill's step (index 0): time.perf_counter()
                                        # when the request got its slot

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def check_token_ids(ids, vocab_size: int) -> None:
    """SpecrtError for a prompt's id that is not a token of a `vocab_size`-token model."""
    bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool)
           or not 0 <= t < vocab_size]
    if bad:
        raise SpecrtError(f"the prompt has token id {bad[0]!r} outside the model's "
                          f"vocabulary 0..{vocab_size - 1}")


def check_request(request: Request, vocab_size: int, max_seq_len: int, has_draft: bool) -> None:
    """Raise SpecrtError naming the problem if `request` cannot run on an engine whose target
    has `vocab_size` tokens and whose caches hold `max_seq_len` positions."""
    p = request.prompt
    n = request.max_new_tokens
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ConfigError(f"max_new_tokens must be a positive integer, got {n!r}")
    if len(p) == 0:
        raise SpecrtError("the prompt is empty: give at least one token")
    check_token_ids(p, vocab_size)
    spec = request.spec
    if spec is not None and spec.method == "draft_model" and not has_draft:
        raise ConfigError(NEEDS_DRAFT)
    check_length(len(p), n, spec, max_seq_len)


def positions_needed(prompt_tokens: int, max_new_tokens: int, spec: SpecConfig | None) -> int:
    """Cache positions reserved for a request: its prompt and budget, and when speculating
    K + 1 more, room for a verify pass's drafts past what the budget commits."""
    k = spec.num_speculative_tokens if spec is not None else 0
    return prompt_tokens + max_new_tokens + (k + 1 if k else 0)


def check_length(prompt_tokens: int, max_new_tokens: int, spec: SpecConfig | None,
                 max_seq_len: int, raise_flag: str = "max_seq_len",
                 budget: str = "max_new_tokens") -> None:
    """prompt + max_new_tokens (+ K + 1 when speculating) must fit in max_seq_len positions;
    raise_flag and budget: how the caller spells the setting to raise (a CLI: --max-seq-len)
    and the token budget (the server: max_tokens)."""
    k = spec.num_speculative_tokens if spec is not None else 0
    need = positions_needed(prompt_tokens, max_new_tokens, spec)
    if need > max_seq_len:
        raise CapacityError(
            f"the prompt ({prompt_tokens} tokens) + {budget} ({max_new_tokens})"
            + (f" + K+1 ({k + 1})" if k else "") + f" = {need} exceeds max_seq_len "
            f"({max_seq_len}); raise {raise_flag} or shorten the request")
