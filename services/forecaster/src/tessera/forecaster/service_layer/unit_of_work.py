"""The forecaster service's unit of work: for now, the events it records."""

from __future__ import annotations

from tessera.core.recording.service_layer import RecordingUnitOfWork
from tessera.forecaster.adapters import orm


class ForecasterUnitOfWork(RecordingUnitOfWork):
    observed_table = orm.observed_events
