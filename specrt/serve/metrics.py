"""Prometheus metrics of one server, under vLLM's names: those below, not all of vLLM's (none
for a prefix cache, which this server does not have, or preemptions, which it never makes; no
`iteration_tokens_total`, `request_params_n` or `cache_config_info`).

The registry belongs to the app (never prometheus_client's global one), so several servers in
one process (tests) keep separate counts. prometheus_client appends `_total` to counter names
in the exposition: `vllm:spec_decode_num_drafts` is scraped as `vllm:spec_decode_num_drafts_total`.

Counters move per engine round (a chunk of the stream), as in vLLM: generated tokens and the
speculative counters (specrt.engine.metrics's definitions, which follow vLLM's) count every
round delivered, so a request that is aborted or fails mid-stream counts what it did, and one
ended by a stop string counts the rounds the engine ran past the stop before the cancel reached
it (`StreamChunk.tail`: drafts proposed and verified; their tokens, dropped, are not counted as
generated, as they are not in `usage`). Latencies
run from a request's arrival at the server to the time the engine handed each round to it
(`Step.delivered`), not to when the client read it: a slow reader does not slow the server's
numbers. A chunk is one round, which may commit several tokens, so
`inter_token_latency_seconds` gets one observation per round, as in vLLM v1; rounds that
commit nothing (a request cancelled while queued) are no latency. A request that held a slot
adds, when it ends (finished or aborted), its phases -- queue: arrival to its slot; prefill:
slot to first token; decode: first to last token; inference: slot to last token -- and its
prompt tokens, generated tokens and max_tokens to their histograms. `kv_cache_usage_perc` is
the share (0..1) of the KV cache's positions holding running requests' tokens
(`LLM.kv_cache_usage`: the cache is allocated whole at load, max_batch_size x max_seq_len
positions per engine, so this is how full it is, not memory in use). Every series exists from
the start at 0 (so `increase()` sees the first event; the per-position acceptance from the
first round that drafts that far), and no `_created` series are exported.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

from specrt.engine.request import Step

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
LABELS = ("model_name",)
FINISH_REASONS = ("stop", "length", "abort")     # OpenAI's, and abort: cancelled before its end


def token_buckets(max_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_len (vLLM's buckets of token-count histograms)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_len:
                return out
            out.append(m * scale)
        scale *= 10


@dataclasses.dataclass(frozen=True)
class Phases:
    """The server's view of a request that held a slot, for the per-request histograms."""

    queue: float                # arrival -> slot
    prefill: float              # slot -> first token
    decode: float               # first -> last token
    inference: float            # slot -> last token
    prompt_tokens: int
    generation_tokens: int      # tokens that reached the client
    max_tokens: int


# Phases' fields -> (series, help, in seconds or tokens)
PER_REQUEST = {
    "queue": ("vllm:request_queue_time_seconds", "Arrival to a slot, seconds.", True),
    "prefill": ("vllm:request_prefill_time_seconds", "A slot to the first token, seconds.",
                True),
    "decode": ("vllm:request_decode_time_seconds", "First token to last token, seconds.", True),
    "inference": ("vllm:request_inference_time_seconds", "A slot to the last token, seconds.",
                  True),
    "prompt_tokens": ("vllm:request_prompt_tokens", "Prompt tokens per request.", False),
    "generation_tokens": ("vllm:request_generation_tokens", "Generated tokens per request.",
                          False),
    "max_tokens": ("vllm:request_params_max_tokens", "The max_tokens of each request.", False),
}


class ServerMetrics:
    def __init__(self, model_name: str, waiting: Callable[[], int], running: Callable[[], int],
                 kv_cache_usage: Callable[[], float], max_len: int):
        """waiting / running: the requests queued for a slot / holding one, over the LLM's
        engines (its `pending` / `running`); kv_cache_usage: `LLM.kv_cache_usage`; max_len:
        the longest request in tokens (the token histograms' last bucket)."""
        disable_created_metrics()          # process-wide, as vLLM does: no `_created` series
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.model_name = model_name

        def counter(name, doc, labels=()):
            return Counter(name, doc, LABELS + tuple(labels), registry=r)

        def histogram(name, doc, buckets=LATENCY_BUCKETS):
            return Histogram(name, doc, LABELS, buckets=buckets, registry=r)

        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Rounds with draft tokens.")
        self.num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                        "Draft tokens proposed.")
        self.num_accepted = counter("vllm:spec_decode_num_accepted_tokens",
                                    "Draft tokens accepted.")
        self.accepted_per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by position in the draft.",
                                        ("position",))
        self.request_success = counter("vllm:request_success",
                                       "Finished requests, by OpenAI finish reason (abort: the "
                                       "client went away, or the server shut down first).",
                                       ("finished_reason",))
        self.request_failure = counter("specrt:request_failure",
                                       "Requests refused or failed, by HTTP status (on any "
                                       "path: a 404 too).", ("status",))
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Arrival to last token, seconds.")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Arrival to first token, seconds.")
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Between consecutive chunks (engine rounds), seconds.")
        tokens = token_buckets(max_len)
        self.per_request = {field: histogram(name, doc, LATENCY_BUCKETS if seconds else tokens)
                            for field, (name, doc, seconds) in PER_REQUEST.items()}
        usage = Gauge("vllm:kv_cache_usage_perc", "Share (0..1) of the KV cache's positions "
                      "holding running requests' tokens.", LABELS, registry=r)
        usage.labels(model_name).set_function(kv_cache_usage)
        holding = Gauge("vllm:num_requests_running", "Requests holding a slot.", LABELS,
                        registry=r)
        queued = Gauge("vllm:num_requests_waiting", "Requests queued for a slot.", LABELS,
                       registry=r)
        queued.labels(model_name).set_function(waiting)
        holding.labels(model_name).set_function(running)
        for family in (self.num_drafts, self.num_draft_tokens, self.num_accepted,
                       self.prompt_tokens, self.generation_tokens, self.e2e, self.ttft,
                       self.itl, *self.per_request.values()):
            family.labels(model_name)                  # every series from the start, at 0
        for reason in FINISH_REASONS:
            self.request_success.labels(model_name, reason)

    # --- per request ------------------------------------------------------------------------
    def admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.labels(self.model_name).inc(prompt_tokens)

    def failed(self, status: int) -> None:
        self.request_failure.labels(self.model_name, str(status)).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model_name).observe(seconds)

    def between_chunks(self, seconds: float) -> None:
        self.itl.labels(self.model_name).observe(seconds)

    def round(self, step: Step | None, tokens: int) -> None:
        """One round delivered to a request: `tokens` of it reach the client; its drafts count
        as specrt.engine.metrics.RequestStats.record_round counts them."""
        m = self.model_name
        self.generation_tokens.labels(m).inc(tokens)
        if step is None or not step.draft_tokens:
            return
        self.num_drafts.labels(m).inc()
        self.num_draft_tokens.labels(m).inc(len(step.draft_tokens))
        self.num_accepted.labels(m).inc(step.num_accepted)
        for pos in range(len(step.draft_tokens)):      # each drafted position's series exists
            series = self.accepted_per_pos.labels(m, str(pos))
            if pos < step.num_accepted:
                series.inc()

    def finished(self, finish_reason: str, seconds: float, phases: Phases | None) -> None:
        """A request ended `seconds` after its arrival; phases: None if it never held a slot."""
        m = self.model_name
        self.request_success.labels(m, finish_reason).inc()
        self.e2e.labels(m).observe(seconds)
        if phases is None:
            return
        for field, family in self.per_request.items():
            family.labels(m).observe(getattr(phases, field))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
