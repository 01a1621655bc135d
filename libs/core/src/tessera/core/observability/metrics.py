"""Prometheus metrics shared by every service; a registry per service process."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

from tessera.core.observability.http_metrics import HttpMetrics


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.messages = Counter(
            "tessera_messages_handled_total",
            "Messages handled by consumer and outcome",
            ["consumer", "outcome"],
            registry=r,
        )
        self.handle_seconds = Histogram(
            "tessera_message_handle_seconds", "Time to handle one message", ["consumer"], registry=r
        )
        self.dead_letters = Counter(
            "tessera_dead_letters_total",
            "Messages sent to a dead-letter subject, by consumer and why (permanent, exhausted, undecodable, too_large)",
            ["consumer", "kind"],
            registry=r,
        )
        self.redeliveries = Counter(
            "tessera_consumer_redeliveries_total",
            "Messages delivered again (a previous delivery was not acked)",
            ["consumer"],
            registry=r,
        )
        self.consumer_resubscribes = Counter(
            "tessera_consumer_resubscribes_total",
            "Times a consumer subscribed again after its fetches failed (its durable consumer or "
            "stream gone, or JetStream away)",
            ["consumer"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "tessera_consumer_lag_messages",
            "Messages in the stream not yet delivered to the consumer, as of its last fetch",
            ["consumer"],
            registry=r,
        )
        self.consumer_ack_pending = Gauge(
            "tessera_consumer_ack_pending_messages",
            "Messages delivered to the consumer and not acked yet, as of its last fetch",
            ["consumer"],
            registry=r,
        )
        self.outbox_published = Counter(
            "tessera_outbox_published_total", "Events published by the outbox relay", registry=r
        )
        self.outbox_publish_failures = Counter(
            "tessera_outbox_publish_failures_total",
            "Outbox rows whose publish failed (they stay, or move to the dead-letter table)",
            ["reason"],
            registry=r,
        )
        self.outbox_dead_lettered = Counter(
            "tessera_outbox_dead_lettered_total",
            "Outbox rows moved to the outbox dead-letter table, never to be published",
            ["reason"],
            registry=r,
        )
        self.outbox_backlog = Gauge(
            "tessera_outbox_backlog_rows", "Rows waiting in the outbox, as of the last sample", registry=r
        )
        self.outbox_oldest_age = Gauge(
            "tessera_outbox_oldest_age_seconds",
            "Age of the oldest row waiting in the outbox (0 when empty), as of the last sample",
            registry=r,
        )
        self.outbox_dead_letter_rows = Gauge(
            "tessera_outbox_dead_letter_rows", "Rows in the outbox dead-letter table", registry=r
        )
        self.nats_connection_events = Counter(
            "tessera_nats_connection_events_total",
            "NATS connection events: disconnected, reconnected, closed, error",
            ["event"],
            registry=r,
        )
        self.nats_connected = Gauge("tessera_nats_connected", "1 while the NATS connection is up", registry=r)
        self.http = HttpMetrics(r)
        """Requests and latency by route (`HttpMetricsMiddleware` observes them)."""
        # the process's CPU, memory, open files and start time (process_*), the interpreter
        # (python_info) and its garbage collector (python_gc_*), as the default registry has them
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
