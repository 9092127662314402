"""Prometheus metrics of the data plane (the operator's are in its own package)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

HTTP_REQUESTS = Counter("wfs_http_requests_total", "HTTP requests by route and status", ["route", "method", "status"])
HTTP_SECONDS = Histogram(
    "wfs_http_request_seconds", "HTTP request latency (subscriptions excluded)", ["route", "method"]
)
APPENDED_RECORDS = Counter("wfs_appended_records_total", "Records appended", ["kind"])
APPEND_SECONDS = Histogram("wfs_append_seconds", "Append latency, credit waits included")
READ_RECORDS = Counter("wfs_read_records_total", "Records returned by reads")
SUBSCRIPTIONS_OPEN = Gauge("wfs_subscriptions_open", "Open SSE subscriptions on this replica")
SUBSCRIPTION_EVENTS = Counter("wfs_subscription_events_total", "Record events sent to subscribers")
CREDIT_WAITS = Counter("wfs_credit_waits_total", "Appends that waited for credit (block policy)")
CREDIT_REJECTIONS = Counter("wfs_credit_rejections_total", "Appends refused for backpressure or quota", ["reason"])
BACKLOG_ITEMS = Gauge(
    "wfs_backlog_unread_items",
    "Unread items over all streams, as of the sampler's last full rolling pass (workers/metrics_sampler.py)",
)
# the top offenders only: a bounded label set (at most BACKLOG_TOP_N series), never one series per stream
BACKLOG_TOP = Gauge(
    "wfs_backlog_top_unread_items", "Unread items of the streams with the most (top 10)", ["run_id", "stream_id"]
)
BACKLOG_STREAMS = Gauge("wfs_backlog_streams_sampled", "Streams the sampler's last full pass covered")
RETENTION_DUE = Gauge("wfs_retention_due_streams", "Streams due for pruning now (from the due index)")
OUTBOX_PENDING = Gauge("wfs_delivery_outbox_pending", "Input deliveries not yet delivered")
OUTBOX_LAG = Gauge("wfs_delivery_outbox_lag_seconds", "Age of the oldest pending input delivery")
DELIVERIES = Counter("wfs_deliveries_total", "Delivery attempts to the wait service", ["outcome"])
DELIVERIES_FAILED = Gauge("wfs_deliveries_failed", "Input deliveries that failed permanently")
WORKER_CLAIMS = Counter("wfs_worker_claims_total", "Claims taken by workers", ["kind", "how"])
