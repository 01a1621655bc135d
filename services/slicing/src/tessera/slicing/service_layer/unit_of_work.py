"""The slicing service's unit of work: for now, the events it records."""

from __future__ import annotations

from tessera.core.recording.service_layer import RecordingUnitOfWork
from tessera.slicing.adapters import orm


class SlicingUnitOfWork(RecordingUnitOfWork):
    observed_table = orm.observed_events
