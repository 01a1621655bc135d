"""A victim's eviction that fails, or gets no answer in time, is logged and the others still go:
the cluster port raises ClusterError, or TimeoutError when a timeout ran out (an OSError), and
neither may fail the scheduling cycle that carries out the preemption."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from tessera.cluster.domain.requirements import PodRef
from tessera.cluster.port import ClusterError
from tessera.scheduler.config import SchedulerSettings
from tessera.scheduler.service_layer import preemption
from tessera.scheduler.service_layer.outcomes import GangInfo
from tessera.scheduler.service_layer.repository_port import Preemption

from .test_scheduler_deleted_members import world
from .test_scheduler_own_binds import Cluster

FakeUnit = Any  # conftest's FakeSchedulerUnitOfWork


class Unanswered:
    """Evictions as the Kubernetes adapter raises them when the API server does not answer."""

    def __init__(self, errors: dict[str, Exception]) -> None:
        self.errors = errors
        self.evicted: list[str] = []

    async def evict(self, ref: PodRef, grace_period_seconds: int | None = None) -> None:
        key = f"{ref.namespace}/{ref.name}"
        if key in self.errors:
            raise self.errors[key]
        self.evicted.append(key)


@pytest.mark.parametrize("error", [TimeoutError("no answer in 30s"), ClusterError("connection refused")])
async def test_a_victim_eviction_without_an_answer_is_logged_and_the_rest_are_evicted(
    uow: FakeUnit, caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    state, _ = world(Cluster(), nodes=1)
    state.gangs["job-1"] = GangInfo("job-1", "job", placed={"ns/a": None, "ns/b": None, "ns/c": None})
    cluster = Unanswered({"ns/b": error})
    request = Preemption("job-1", "job-9", "checkpoint_saved", grace_period_s=0)

    with caplog.at_level(logging.WARNING, logger=preemption.log.name):
        async with uow:
            held = await preemption._evict(
                request, uow.repo, state, SimpleNamespace(cluster=cluster), SchedulerSettings(), 100.0
            )

    assert held == ["ns/a", "ns/b", "ns/c"]
    assert cluster.evicted == ["ns/a", "ns/c"]
    assert [(r.getMessage(), getattr(r, "pod", "")) for r in caplog.records] == [
        ("eviction of a victim failed", "ns/b")
    ]
