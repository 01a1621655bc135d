"""The learnt typical workload follows the scheduler's `workload_profile` settings: how many placements
the engine samples, how many GPU pods it needs to trust them, and how often it learns again."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.scheduler.config import SchedulerSettings, WorkloadProfileSettings
from tessera.scheduler.domain.placement import OPENB_TYPICAL_WORKLOAD, TypicalPod
from tessera.scheduler.service_layer.engine import SchedulingEngine
from tessera.scheduler.service_layer.repository_port import PlacementRow

# conftest's FakeSchedulerUnitOfWork (a conftest module cannot be imported).
FakeUnit = Any

T0 = 1_800_000_000.0
EIGHT_GPU_POD = TypicalPod(32_000, 8, 1000, frozenset(), 1.0)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def profile(**fields: Any) -> SchedulerSettings:
    return SchedulerSettings(workload_profile=WorkloadProfileSettings(**fields))


async def seed(uow: FakeUnit, eight_gpu_pods: int) -> None:
    """A GPU node to score, and 8-GPU placements from earlier (on nodes since gone)."""
    gpus = [GpuInventory(index=i, uuid=f"GPU-{i}", model="A100-80GB", memory_mib=81920) for i in range(8)]
    rows = [
        PlacementRow(
            f"train-{i}",
            f"default/train-{i}-0",
            "workers",
            f"gone-{i}",
            tuple((g, 1000) for g in range(8)),
            32_000,
            1024,
        )
        for i in range(eight_gpu_pods)
    ]
    async with uow:
        await uow.repo.replace_inventory(
            "cluster-file", [NodeInventory(name="gpu-0", cpu_milli=64_000, memory_mib=524_288, gpus=gpus)]
        )
        await uow.repo.record_placements(rows)
        await uow.commit()


def engine_on(uow: FakeUnit, settings: SchedulerSettings, clock: Clock) -> SchedulingEngine:
    return SchedulingEngine(lambda: uow, settings, clock=clock)


def typical(engine: SchedulingEngine) -> tuple[TypicalPod, ...]:
    assert engine.state is not None and engine.state.fragmentation is not None
    return engine.state.fragmentation.typical


def test_the_defaults_are_those_adr_0011_names() -> None:
    defaults = SchedulerSettings().workload_profile

    assert (defaults.sample_size, defaults.min_gpu_pods, defaults.refresh_s) == (1000, 50, 300.0)


def test_the_profile_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_SCHEDULER_WORKLOAD_PROFILE__SAMPLE_SIZE", "200")
    monkeypatch.setenv("TESSERA_SCHEDULER_WORKLOAD_PROFILE__MIN_GPU_PODS", "20")
    monkeypatch.setenv("TESSERA_SCHEDULER_WORKLOAD_PROFILE__REFRESH_S", "60")

    loaded = SchedulerSettings().workload_profile

    assert (loaded.sample_size, loaded.min_gpu_pods, loaded.refresh_s) == (200, 20, 60.0)


@pytest.mark.parametrize(
    "fields",
    [
        {"sample_size": 0},
        {"min_gpu_pods": 0},
        {"refresh_s": 0},
        {"refresh_s": -5},
        {"sample_size": 40, "min_gpu_pods": 50},  # could never be learnt
    ],
)
def test_a_profile_that_cannot_work_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        WorkloadProfileSettings(**fields)


async def test_the_engine_samples_as_many_placements_as_the_settings_say(uow: FakeUnit) -> None:
    await seed(uow, eight_gpu_pods=3)
    engine = engine_on(uow, profile(sample_size=7, min_gpu_pods=2), Clock())

    await engine.cycle()

    assert uow.stored.samples == [7]


@pytest.mark.parametrize(
    ("min_gpu_pods", "expected"),
    [(3, (EIGHT_GPU_POD,)), (4, OPENB_TYPICAL_WORKLOAD)],
    ids=["enough-gpu-pods", "too-few-gpu-pods"],
)
async def test_the_engine_trusts_the_sample_from_the_settings_minimum_on(
    min_gpu_pods: int, expected: tuple[TypicalPod, ...], uow: FakeUnit
) -> None:
    await seed(uow, eight_gpu_pods=3)
    engine = engine_on(uow, profile(min_gpu_pods=min_gpu_pods), Clock())

    await engine.cycle()

    assert typical(engine) == expected


async def test_the_engine_learns_again_at_the_settings_interval(uow: FakeUnit) -> None:
    await seed(uow, eight_gpu_pods=1)
    clock = Clock()
    engine = engine_on(uow, profile(sample_size=5, min_gpu_pods=2, refresh_s=30), clock)
    await engine.cycle()  # the rebuild learns it first
    assert typical(engine) == OPENB_TYPICAL_WORKLOAD

    await seed(uow, eight_gpu_pods=2)  # enough GPU pods now
    clock.now = T0 + 29
    await engine.cycle()
    assert (uow.stored.samples, typical(engine)) == ([5], OPENB_TYPICAL_WORKLOAD)

    clock.now = T0 + 30
    await engine.cycle()
    assert (uow.stored.samples, typical(engine)) == ([5, 5], (EIGHT_GPU_POD,))
