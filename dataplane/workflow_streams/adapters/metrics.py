"""Prometheus metrics of the data plane (the operator's are in its own package).

With ``serve --workers N`` the N processes share one port, so a scrape lands on any of them. The parent
then runs prometheus_client's multiprocess mode (``shells.serving`` sets ``PROMETHEUS_MULTIPROC_DIR`` before
the workers start): each worker writes its values to mmap files in that directory and ``/metrics`` sums
them, so every scrape speaks for all the workers. Counters and histograms add up across processes; each
gauge says how (``multiprocess_mode``, ignored in one process).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

HTTP_REQUESTS = Counter("wfs_http_requests_total", "HTTP requests by route and status", ["route", "method", "status"])
HTTP_SECONDS = Histogram(
    "wfs_http_request_seconds", "HTTP request latency (subscriptions excluded)", ["route", "method"]
)
APPENDED_RECORDS = Counter("wfs_appended_records_total", "Records appended", ["kind"])
# One observation per group-commit transaction: its _count is transactions, its _sum the append requests
# they carried, so their ratio says how well concurrent appends share a commit (bench prints it per case).
GROUP_COMMIT_REQUESTS = Histogram(
    "wfs_group_commit_requests",
    "Append requests per group-commit transaction",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
READ_RECORDS = Counter("wfs_read_records_total", "Records returned by reads")
# each worker counts its own subscriptions: the replica's total is their sum, over live workers only
SUBSCRIPTIONS_OPEN = Gauge(
    "wfs_subscriptions_open", "Open SSE subscriptions on this replica", multiprocess_mode="livesum"
)
SUBSCRIPTION_EVENTS = Counter("wfs_subscription_events_total", "Record events sent to subscribers")
CREDIT_WAITS = Counter("wfs_credit_waits_total", "Appends that waited for credit (block policy)")
CREDIT_REJECTIONS = Counter("wfs_credit_rejections_total", "Appends refused for backpressure or quota", ["reason"])
# The gauges below are sampled from Postgres (workers/metrics_sampler.py), and every worker samples the
# same database: summing would count it N times. "mostrecent" shows the freshest worker's sample.
BACKLOG_ITEMS = Gauge(
    "wfs_backlog_unread_items",
    "Unread items over all streams, as of the sampler's last full rolling pass (workers/metrics_sampler.py)",
    multiprocess_mode="mostrecent",
)
BACKLOG_STREAMS = Gauge(
    "wfs_backlog_streams_sampled", "Streams the sampler's last full pass covered", multiprocess_mode="mostrecent"
)
RETENTION_DUE = Gauge(
    "wfs_retention_due_streams", "Streams due for pruning now (from the due index)", multiprocess_mode="mostrecent"
)
OUTBOX_PENDING = Gauge(
    "wfs_delivery_outbox_pending", "Input deliveries not yet delivered", multiprocess_mode="mostrecent"
)
OUTBOX_LAG = Gauge(
    "wfs_delivery_outbox_lag_seconds", "Age of the oldest pending input delivery", multiprocess_mode="mostrecent"
)
DELIVERIES = Counter("wfs_deliveries_total", "Delivery attempts to the wait service", ["outcome"])
DELIVERIES_FAILED = Gauge(
    "wfs_deliveries_failed", "Input deliveries that failed permanently", multiprocess_mode="mostrecent"
)
WORKER_CLAIMS = Counter("wfs_worker_claims_total", "Claims taken by workers", ["kind", "how"])
# runtime.supervisor: background tasks restarted after a failure, and those down now (per worker: summed)
BACKGROUND_RESTARTS = Counter("wfs_background_restarts_total", "Background tasks restarted after they failed", ["task"])
BACKGROUND_DOWN = Gauge(
    "wfs_background_down", "Background tasks failed and not yet restarted", ["task"], multiprocess_mode="livesum"
)
# runtime.durability: reads that waited for a commit to confirm what they saw, and barrier commits made
DURABILITY_WAITS = Counter("wfs_durability_waits_total", "Reads that waited until what they saw was confirmed")
DURABILITY_BARRIERS = Counter("wfs_durability_barriers_total", "Barrier commits made to confirm reads")
DURABILITY_HELD_BACK = Counter(
    "wfs_durability_held_back_records_total", "Records read but not served: not confirmed durable in time"
)


class TopBacklog(Collector):
    """``wfs_backlog_top_unread_items``: the streams with the most unread items, as of the last full pass.

    Not a labelled Gauge: the label set changes with every pass, and multiprocess mode cannot remove a
    series (its mmap files keep every label set ever written), so the top would only grow. The answer is
    this process's own last pass instead; every worker's pass covers all streams, so any worker's is a
    whole answer.
    """

    NAME = "wfs_backlog_top_unread_items"

    def __init__(self) -> None:
        self._top: list[tuple[int, str, str]] = []

    def set(self, top: Sequence[tuple[int, str, str]]) -> None:
        """Replace the series with ``(unread, run_id, stream_id)`` of the top streams."""
        self._top = list(top)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            self.NAME, "Unread items of the streams with the most (top 10)", labels=["run_id", "stream_id"]
        )
        for unread, run_id, stream_id in self._top:
            family.add_metric([run_id, stream_id], unread)
        yield family


# the top offenders only: a bounded label set (at most TOP_N series), never one series per stream
BACKLOG_TOP = TopBacklog()
REGISTRY.register(BACKLOG_TOP)


def exposition() -> bytes:
    """The text of ``/metrics``: of every worker's files in multiprocess mode, else of this process."""
    if not os.environ.get(MULTIPROC_DIR_ENV):
        return generate_latest()
    # a fresh registry per scrape, as prometheus_client's multiprocess documentation does: it holds no
    # values of its own, only the collector reading the workers' files (and the process-local top)
    registry = CollectorRegistry()
    MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # prometheus_client leaves it untyped
    registry.register(BACKLOG_TOP)
    return generate_latest(registry)
