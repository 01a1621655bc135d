"""One stream per service over `tessera.<service>.>`, provisioned idempotently at start-up."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from tessera.contracts import subjects

log = logging.getLogger(__name__)


#: what a full stream does with a new message: "old" makes room by dropping its oldest messages,
#: consumed or not; "new" refuses the message (the publisher gets an error, and the outbox keeps the
#: row in the database until there is room)
Discard = Literal["old", "new"]


@dataclass(frozen=True)
class StreamLimits:
    duplicate_window_s: float = 120.0
    max_age_s: float = 7 * 24 * 3600.0
    max_bytes: int = 1024**3
    replicas: int = 1
    discard: Discard = "old"


async def ensure_stream(js: JetStreamContext, service: str, limits: StreamLimits) -> None:
    """Create the service's stream, or bring an existing one to the configured limits (its discard
    policy too)."""
    config = StreamConfig(
        name=subjects.stream_name(service),
        subjects=[subjects.stream_subjects(service)],
        storage=StorageType.FILE,
        duplicate_window=limits.duplicate_window_s,
        max_age=limits.max_age_s,
        max_bytes=limits.max_bytes,
        num_replicas=limits.replicas,
        discard=DiscardPolicy.NEW if limits.discard == "new" else DiscardPolicy.OLD,
    )
    try:
        await js.stream_info(config.name or "")
    except NotFoundError:
        await js.add_stream(config)
        log.info("stream created", extra={"stream": config.name})
        return
    await js.update_stream(config)


async def ensure_streams(js: JetStreamContext, limits: dict[str, StreamLimits]) -> None:
    for service, stream_limits in limits.items():
        await ensure_stream(js, service, stream_limits)
