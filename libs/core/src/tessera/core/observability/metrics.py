"""Prometheus metrics shared by every service; a registry per service process."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.messages = Counter(
            "tessera_messages_handled_total",
            "Messages handled by consumer and outcome",
            ["consumer", "outcome"],
            registry=self.registry,
        )
        self.handle_seconds = Histogram(
            "tessera_message_handle_seconds",
            "Time to handle one message",
            ["consumer"],
            registry=self.registry,
        )
        self.outbox_published = Counter(
            "tessera_outbox_published_total",
            "Events published by the outbox relay",
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "tessera_dead_letters_total",
            "Messages sent to a dead-letter subject",
            ["consumer"],
            registry=self.registry,
        )
