"""Checkpoint records each gang placement it consumes, to know later which jobs run where."""

from __future__ import annotations

import pytest

from tessera.checkpoint import bootstrap
from tessera.checkpoint.adapters import orm
from tessera.checkpoint.config import CheckpointSettings
from tessera.checkpoint.service_layer.unit_of_work import CheckpointUnitOfWork
from tessera.contracts import subjects
from tessera.contracts.events import GangPlaced, GpuAssignment, PodPlacement
from tessera.core.db.retention import RetentionRule
from tessera.testing.builders import an_envelope
from tessera.testing.fakes import FakeRecordingUnitOfWork


class FakeCheckpointUnitOfWork(FakeRecordingUnitOfWork, CheckpointUnitOfWork):
    pass


def placed(job_id: str, *nodes: str) -> GangPlaced:
    pods = [
        PodPlacement(
            pod=f"{job_id}-{i}",
            group="workers",
            node=node,
            gpus=[GpuAssignment(index=0, uuid=f"GPU-{node}", milli=1000)],
        )
        for i, node in enumerate(nodes)
    ]
    return GangPlaced(job_id=job_id, placements=pods)


async def test_every_placement_is_recorded_under_its_job() -> None:
    (placements,) = bootstrap.consumers()
    assert (placements.stream_owner, placements.filter_subject) == ("scheduler", subjects.GANG_PLACED)
    uow = FakeCheckpointUnitOfWork()
    gangs = [placed("train-a", "gpu-node-0", "gpu-node-1"), placed("train-b", "gpu-node-2")]
    for gang in gangs:
        async with uow:
            await placements.handler(an_envelope(gang, source="tessera/scheduler"), uow)
            await uow.commit()
    assert [(e.subject, e.source, e.type) for e in uow.recorded] == [
        ("train-a", "tessera/scheduler", GangPlaced.TYPE),
        ("train-b", "tessera/scheduler", GangPlaced.TYPE),
    ]
    assert [GangPlaced.model_validate(e.data) for e in uow.recorded] == gangs
    assert uow.commits == 2 and uow.outbox == []


@pytest.mark.parametrize(("env", "kept_h"), [(None, 168.0), ("12", 12.0)])
def test_placements_are_kept_a_week_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, env: str | None, kept_h: float
) -> None:
    if env is None:
        monkeypatch.delenv("TESSERA_CHECKPOINT_OBSERVED_RETENTION_H", raising=False)
    else:
        monkeypatch.setenv("TESSERA_CHECKPOINT_OBSERVED_RETENTION_H", env)
    assert bootstrap.build(CheckpointSettings()).retention == [
        RetentionRule(orm.observed_events, "received_at", kept_h * 3600)
    ]


def test_a_retention_of_zero_hours_is_refused() -> None:
    with pytest.raises(ValueError, match="observed_retention_h"):
        CheckpointSettings(observed_retention_h=0)
