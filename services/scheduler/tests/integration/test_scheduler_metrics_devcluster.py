"""The scheduler's metrics move with its decisions, on the 4x8 A100 devcluster with real Postgres
and NATS, read through the Prometheus text exposition of the service's registry."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tessera.core.runner import RunningService
from tessera.scheduler import bootstrap
from tessera.scheduler.service_layer.dependencies import SchedulerDeps
from tessera.testing.services import eventually, running

from .test_scheduler_on_devcluster import (  # noqa: F401 (fixtures)
    World,
    _async,
    bound,
    devcluster,
    gang_job,
    job_prefix,
    world,
)

pytestmark = pytest.mark.integration

MODEL = (("model", "A100-80GB"),)


def scrape(service: RunningService[SchedulerDeps]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(service.ctx.metrics.registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def pending_gangs(got: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return sum(v for (name, _), v in got.items() if name == "tessera_scheduler_pending_gangs")


async def test_binding_a_gang_moves_the_allocation_gauge_and_the_bind_histogram(
    world: World,  # noqa: F811 (the fixture)
) -> None:
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    settings = world.settings()
    async with running(bootstrap.build(settings), settings) as service:
        await world.admit(first, gang_job("alpha", duration_s=None))
        await eventually(
            lambda: _async(len(bound(world.pods(job_prefix("alpha", first)))) == 4),
            what="the gang bound",
            timeout=20,
        )
        await eventually(
            lambda: _async(scrape(service).get(("tessera_scheduler_gpus_allocated", MODEL)) == 32),
            what="32 GPUs allocated",
        )
        got = scrape(service)
        assert got[("tessera_scheduler_gpus_capacity", MODEL)] == 32
        assert got[("tessera_scheduler_bind_latency_seconds_count", ())] == 1
        assert got[("tessera_scheduler_bind_latency_seconds_sum", ())] > 0
        assert got[("tessera_scheduler_submission_to_bound_seconds_count", ())] == 1
        # submitted (here: admitted at once) before the scheduler took the gang in
        assert (
            got[("tessera_scheduler_submission_to_bound_seconds_sum", ())]
            >= got[("tessera_scheduler_bind_latency_seconds_sum", ())]
        )
        assert got[("tessera_scheduler_cycle_duration_seconds_count", ())] >= 1
        assert pending_gangs(got) == 0 and got[("tessera_scheduler_pending_pods", ())] == 0
        assert got[("tessera_scheduler_fragmented_gpus", MODEL)] == 0, "a full cluster has no idle GPU"

        await world.admit(second, gang_job("beta", duration_s=None))  # no GPU left: it waits
        await eventually(
            lambda: _async(
                pending_gangs(scrape(service)) == 1
                and scrape(service).get(("tessera_scheduler_pending_pods", ())) == 4
            ),
            what="one gang of 4 pods pending",
        )
        got = scrape(service)
        assert got[("tessera_scheduler_bind_latency_seconds_count", ())] == 1, "nothing more bound"
        assert got[("tessera_scheduler_gpus_allocated", MODEL)] == 32
    stopped = scrape(service)
    assert ("tessera_scheduler_gpus_allocated", MODEL) not in stopped, "a replica not deciding shows none"
    assert stopped[("tessera_scheduler_bind_latency_seconds_count", ())] == 1, "the histogram stays"
