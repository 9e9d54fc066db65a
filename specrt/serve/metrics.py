"""Prometheus metrics of one server, under vLLM's names so dashboards built for vLLM work.

The registry belongs to the app (never prometheus_client's global one), so several servers in
one process (tests) keep separate counts. prometheus_client appends `_total` to counter names
in the exposition: `vllm:spec_decode_num_drafts` is scraped as `vllm:spec_decode_num_drafts_total`.

Speculative counters come from each finished request's stats (specrt.engine.metrics, which
follows vLLM's definitions). Latencies are measured here, in the server, from the arrival of
each request and of each of its chunks: a chunk is one engine round, which may commit several
tokens, so `inter_token_latency_seconds` gets one observation per round, as in vLLM v1.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
LABELS = ("model_name",)


class ServerMetrics:
    def __init__(self, model_name: str, waiting: Callable[[], int]):
        """waiting: the number of requests queued for a slot (the scheduler's pending)."""
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self._in_flight = 0

        def counter(name, doc, labels=()):
            return Counter(name, doc, LABELS + tuple(labels), registry=r)

        def histogram(name, doc):
            return Histogram(name, doc, LABELS, buckets=LATENCY_BUCKETS, registry=r)

        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Rounds with draft tokens.")
        self.num_draft_tokens = counter("vllm:spec_decode_num_draft_tokens",
                                        "Draft tokens proposed.")
        self.num_accepted = counter("vllm:spec_decode_num_accepted_tokens",
                                    "Draft tokens accepted.")
        self.accepted_per_pos = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by position in the draft.",
                                        ("position",))
        self.request_success = counter("vllm:request_success",
                                       "Finished requests, by OpenAI finish reason "
                                       "(abort: the client went away).", ("finished_reason",))
        self.request_failure = counter("specrt:request_failure",
                                       "Requests refused or failed, by HTTP status.", ("status",))
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generated tokens.")
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Arrival to last token, seconds.")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Arrival to first token, seconds.")
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Between consecutive chunks (engine rounds), seconds.")
        running = Gauge("vllm:num_requests_running", "Requests holding a slot.", LABELS,
                        registry=r)
        queued = Gauge("vllm:num_requests_waiting", "Requests queued for a slot.", LABELS,
                       registry=r)
        queued.labels(model_name).set_function(lambda: waiting())
        running.labels(model_name).set_function(lambda: max(0, self._in_flight - waiting()))

    # --- per request ------------------------------------------------------------------------
    def started(self) -> None:
        self._in_flight += 1          # the event loop is the only writer

    def admitted(self, prompt_tokens: int) -> None:
        self.prompt_tokens.labels(self.model_name).inc(prompt_tokens)

    def ended(self) -> None:
        self._in_flight -= 1

    def failed(self, status: int) -> None:
        self.request_failure.labels(self.model_name, str(status)).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.labels(self.model_name).observe(seconds)

    def between_chunks(self, seconds: float) -> None:
        self.itl.labels(self.model_name).observe(seconds)

    def finished(self, finish_reason: str, new_tokens: int, seconds: float,
                 stats: dict | None) -> None:
        m = self.model_name
        self.request_success.labels(m, finish_reason).inc()
        self.generation_tokens.labels(m).inc(new_tokens)
        self.e2e.labels(m).observe(seconds)
        if not stats:
            return
        self.num_drafts.labels(m).inc(stats.get("num_drafts", 0))
        self.num_draft_tokens.labels(m).inc(stats.get("num_draft_tokens", 0))
        self.num_accepted.labels(m).inc(stats.get("num_accepted_tokens", 0))
        for pos, n in enumerate(stats.get("accepted_per_position", ())):
            self.accepted_per_pos.labels(m, str(pos)).inc(n)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
