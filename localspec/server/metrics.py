"""``GET /metrics``: Prometheus counters named as llama-server and vLLM name theirs.

Every name carries llama-server's ``llamacpp:`` prefix. Where llama-server has the quantity its
name is kept (``prompt_tokens_total``, ``tokens_predicted_total``, ``n_decode_total``,
``requests_processing``, ``requests_deferred``...); the speculative counters take vLLM's names
(``spec_decode_num_drafts_total``, ``spec_decode_num_draft_tokens_total``,
``spec_decode_num_accepted_tokens_total``, ``spec_decode_num_accepted_tokens_per_pos_total``);
the rest are localspec's own (``requests_total``, ``requests_finished_total``, ``step_seconds``,
``spec_decode_num_reached_tokens_per_pos_total``). docs/server.md lists them all.

The metrics live in their own registry (nothing of the process's global one is served).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from localspec.events import DoneEvent, Event, StepEvent

if TYPE_CHECKING:
    from localspec.generation import Generation

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text format llama-server writes and every Prometheus scrapes."""

# Step times span a 135M model's ~5 ms on a GPU to a large model's seconds on a laptop CPU.
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


class ServerMetrics:
    """The server's counters; ``observe`` is the slot's observer (it runs on the engine's thread)."""

    def __init__(self) -> None:
        self._waiting: Callable[[], int] = lambda: 0
        self._generating: Callable[[], bool] = lambda: False
        # llama-server writes no `_created` series; without them each counter is one line.
        prometheus_client.disable_created_metrics()
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("llamacpp:requests", "HTTP requests answered, by endpoint and status code",
                                ["endpoint", "code"], registry=r)
        self.finished = Counter("llamacpp:requests_finished",
                                "generations ended, by finish reason (stop, length, context, cancelled)",
                                ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("llamacpp:prompt_tokens", "prompt tokens decoded (not taken from the cache)",
                                     registry=r)
        self.prompt_seconds = Counter("llamacpp:prompt_seconds", "time spent decoding prompts", registry=r)
        self.cached_tokens = Counter("llamacpp:prompt_tokens_cached",
                                     "prompt tokens found in the cache (the conversation's prefix)", registry=r)
        self.predicted = Counter("llamacpp:tokens_predicted", "tokens generated", registry=r)
        self.predicted_seconds = Counter("llamacpp:tokens_predicted_seconds", "time spent generating", registry=r)
        self.decodes = Counter("llamacpp:n_decode", "target forward passes (speculative steps)", registry=r)
        self.drafts = Counter("llamacpp:spec_decode_num_drafts", "steps that verified a draft", registry=r)
        self.draft_tokens = Counter("llamacpp:spec_decode_num_draft_tokens", "draft tokens proposed", registry=r)
        self.accepted_tokens = Counter("llamacpp:spec_decode_num_accepted_tokens", "draft tokens accepted",
                                       registry=r)
        self.accepted_per_pos = Counter("llamacpp:spec_decode_num_accepted_tokens_per_pos",
                                        "draft tokens accepted at each position of their draft", ["position"],
                                        registry=r)
        self.reached_per_pos = Counter("llamacpp:spec_decode_num_reached_tokens_per_pos",
                                       "draft tokens at each position whose earlier tokens were all accepted "
                                       "(accepted_per_pos / reached_per_pos: acceptance by position)",
                                       ["position"], registry=r)
        self.step_seconds = Histogram("llamacpp:step_seconds", "time of one speculative step (draft, verify, "
                                      "bookkeeping)", buckets=STEP_BUCKETS, registry=r)
        Gauge("llamacpp:requests_processing", "generations running (0 or 1: one engine, one user)",
              registry=r).set_function(lambda: float(self._generating()))
        Gauge("llamacpp:requests_deferred", "requests waiting in line for the engine",
              registry=r).set_function(lambda: float(self._waiting()))

    def track(self, waiting: Callable[[], int], generating: Callable[[], bool]) -> None:
        """Where the two gauges read their values when scraped (the slot's line and state)."""
        self._waiting = waiting
        self._generating = generating

    def observe(self, generation: "Generation", event: Event) -> None:
        """One event of a running generation: each step's time, then the totals when it is done."""
        if isinstance(event, StepEvent):
            self.step_seconds.observe(event.step_ms / 1e3)
        elif isinstance(event, DoneEvent):
            self._count(event, generation.cached_tokens)

    def _count(self, done: DoneEvent, cached: int) -> None:
        s = done.stats
        self.finished.labels(done.finish_reason).inc()
        self.prompt_tokens.inc(max(0, s.prompt_tokens - cached))
        self.cached_tokens.inc(cached)
        self.prompt_seconds.inc(s.prefill_ms / 1e3)
        self.predicted.inc(s.tokens)
        self.predicted_seconds.inc(s.elapsed_s)
        self.decodes.inc(s.steps)
        self.drafts.inc(sum(d.steps for d in s.drafters))
        self.draft_tokens.inc(s.drafted)
        self.accepted_tokens.inc(s.accepted)
        for i, (reached, accepted) in enumerate(zip(s.position_drafted, s.position_accepted)):
            self.reached_per_pos.labels(str(i)).inc(reached)
            self.accepted_per_pos.labels(str(i)).inc(accepted)

    def count_request(self, endpoint: str, code: int) -> None:
        self.requests.labels(endpoint, str(code)).inc()

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
