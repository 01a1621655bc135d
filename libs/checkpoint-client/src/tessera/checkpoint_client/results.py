"""What a `Checkpointer` takes and hands back: the state, save requests, and the result of each checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tessera.checkpoint_client.errors import CheckpointError

State = Mapping[Any, Any] | Callable[[], Mapping[Any, Any]]


@dataclass(frozen=True)
class SaveRequest:
    reason: str
    request_id: str | None = None
    deadline: datetime | None = None


@dataclass(frozen=True)
class CheckpointResult:
    """The outcome of one checkpoint, once its flush ended."""

    ok: bool
    step: int
    trigger: str  # requested, periodic, manual
    requests: tuple[SaveRequest, ...] = ()
    uri: str = ""
    checkpoint_id: str = ""
    size_bytes: int = 0
    stall_s: float = 0.0
    flush_s: float = 0.0
    reason: str = ""  # why it failed
    finished_at: datetime = field(default_factory=lambda: datetime.now(UTC))


class StorageUnavailable(CheckpointError):
    pass
