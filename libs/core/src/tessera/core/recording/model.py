"""An event as a service received it. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class ObservedEvent:
    """A consumed event, kept whole: its CloudEvents attributes and its body."""

    event_id: str
    type: str
    subject: str
    source: str
    occurred_at: datetime
    data: dict[str, Any]
