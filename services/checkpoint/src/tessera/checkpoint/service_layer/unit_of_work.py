"""The checkpoint service's unit of work: for now, the events it records."""

from __future__ import annotations

from tessera.checkpoint.adapters import orm
from tessera.core.recording.service_layer import RecordingUnitOfWork


class CheckpointUnitOfWork(RecordingUnitOfWork):
    observed_table = orm.observed_events
