"""The server's Prometheus metrics at `GET /metrics` (docs/serving.md §6), through prometheus_client.

One `CollectorRegistry` per app, never the library's global one, so a process may hold several
servers (the tests do) and each scrape reads only its own. Queue depth and running rows are read
from the batcher when scraped; the rest is counted where it happens: a request's status and times
in the app, each model forward's rows in the batcher that ran it.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# how a request ended: answered, failed in the engine, cancelled (the client left, or shutdown), refused before it queued
STATUSES = ("ok", "failed", "cancelled", "refused")
SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 150, 600)
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
FORWARDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    """The metrics of one server; `queued` and `running`: read at each scrape; `front_points`: the
    points of the front it follows (0: none)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queued: Callable[[], int], running: Callable[[], int], front_points: int = 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("dinfer_requests", "HTTP completion requests by how they ended", ["status"], registry=r)
        for status in STATUSES:  # every status is scraped from the start, at 0
            self.requests.labels(status)
        Gauge("dinfer_queue_depth", "rows submitted and not yet decoding", registry=r).set_function(queued)
        Gauge("dinfer_running_rows", "rows decoding now", registry=r).set_function(running)
        self.rows_per_forward = Histogram("dinfer_rows_per_forward", "rows one model forward decoded together", buckets=ROWS, registry=r)
        self.forwards_per_request = Histogram("dinfer_forwards_per_row", "a finished row's forwards (its NFE)", buckets=FORWARDS, registry=r)
        self.first_token = Histogram(
            "dinfer_time_to_first_token_seconds", "from a request's arrival to its first final text (a stream's first text chunk; otherwise the answer)",
            buckets=SECONDS, registry=r,
        )
        self.latency = Histogram("dinfer_request_latency_seconds", "from a request's arrival to its last row's end", buckets=SECONDS, registry=r)
        self.tokens = Counter("dinfer_generated_tokens", "answer tokens of finished rows (usage.completion_tokens)", registry=r)
        self.forwards = Counter("dinfer_forwards", "model forwards the engine ran (a shared forward counts once)", registry=r)
        self.prefix_hits = Counter("dinfer_prefix_cache_hits", "rows whose prompt's first blocks' K/V came from the prefix cache", registry=r)
        # a server following a tuned front (engine/serving/front.py): its answers by the point they ran, "own" for a request's own settings
        self.front_answers = Counter("dinfer_front_point_answers", "answered requests by the tuned front's point they ran", ["point"], registry=r) if front_points else None
        for point in [*map(str, range(front_points)), "own"] if front_points else []:
            self.front_answers.labels(point)  # type: ignore[union-attr]
        self.prefix_tokens = Counter("dinfer_prefix_cache_saved_tokens", "prompt tokens whose K/V the prefix cache supplied, not computed", registry=r)

    def forward(self, rows: int) -> None:
        """One model forward of `rows` rows ran."""
        self.forwards.inc()
        self.rows_per_forward.observe(rows)

    def prefix_hit(self, tokens: int) -> None:
        """A row took `tokens` prompt tokens' K/V from the prefix cache (engine.cache.PrefixStore)."""
        self.prefix_hits.inc()
        self.prefix_tokens.inc(tokens)

    def scrape(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
