"""A recording service's definition: its consumers all record, and what it recorded is kept for a while."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field
from sqlalchemy import Table

from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.recording.repository import RECEIVED_AT
from tessera.core.recording.service_layer import RecordingUnitOfWork
from tessera.core.runner import ServiceContext, ServiceDefinition, context_only


def observed_retention_h(default: float) -> Any:
    """The setting of how long observed events are kept, with the service's own default."""
    return Field(default, gt=0, description="observed events stored longer ago than this are deleted")


def recording_service(
    name: str,
    *,
    outbox: Table,
    inbox: Table,
    unit_of_work: type[RecordingUnitOfWork],
    consumers: Sequence[ConsumerSpec[Any]],
    observed_retention_h: float,
) -> ServiceDefinition[ServiceContext]:
    rule = RetentionRule(unit_of_work.observed_table, RECEIVED_AT, observed_retention_h * 3600)
    return ServiceDefinition(
        name=name,
        outbox=outbox,
        inbox=inbox,
        dependencies=context_only,
        unit_of_work=unit_of_work,
        consumers=lambda _ctx: list(consumers),
        retention=[rule],
    )
