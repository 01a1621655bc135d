"""Readings whose source had no utilisation (dcgm-exporter's NaN, or a MIG instance's without the engine
activity, which it does not export then): their allocation, memory and cost are counted, not as 0% used nor as idle time, and they are
not published as samples; the rest of the round is counted as before."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tessera.telemetry.adapters.sources.dcgm import readings_from_exposition
from tessera.telemetry.domain.attributed import Attributed, AttributedGpu
from tessera.telemetry.domain.attribution import Holder, Share, split_reading
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pricing import CapacityType, Flavor, PriceBook, Pricing
from tessera.telemetry.domain.rightsizing import RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_rows import AccountingPolicy
from tessera.telemetry.entrypoints.publishers import _account, _publish_samples
from tessera.telemetry.service_layer.usage import UsageLedger

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
A100 = Pricing("a100", CapacityType.ON_DEMAND, 4.0)
PRICES = PriceBook((Flavor("a100", "A100-80GB", None, 4.0),))


def reading(gpu: str, util: float, known: bool = True) -> Reading:
    return Reading("n0", 0, gpu, NOW, util, 1000, 100.0, 40.0, "A100-80GB", 81920, utilization_known=known)


@dataclass
class Published:
    subjects: list[str] = field(default_factory=list)

    async def publish(self, subject: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.subjects.append(subject)


class SplitEach:
    async def attribute(
        self, readings: Sequence[Reading], placed_milli: Any = None, placements: int | None = None
    ) -> Attributed:
        holders = {r.gpu_uuid: [Holder("ns", f"pod-{r.gpu_uuid}", "main", r.gpu_uuid)] for r in readings}
        return Attributed(
            gpus=[
                AttributedGpu(r, split_reading(r.utilization_pct, r.memory_used_mib, holders[r.gpu_uuid]))
                for r in readings
            ]
        )


def a_sampler(js: Published) -> Any:
    ctx = SimpleNamespace(metrics=SimpleNamespace(registry=CollectorRegistry()), js=js)
    ledger = UsageLedger(Accountant(AccountingPolicy(interval_s=10.0)), PRICES, RightsizingTracker())
    return SimpleNamespace(
        ctx=ctx,
        ledger=ledger,
        attributor=SplitEach(),
        attribution_problems={},
        sample_interval_s=10.0,
        usage_flush_s=1e9,
        currency="USD",
        source=SimpleNamespace(name="dcgm:n0"),
    )


def mig_reading(at: datetime) -> Reading:
    """A GPU split into MIG instances as dcgm-exporter exports it without its profiling fields: no
    DCGM_FI_DEV_GPU_UTIL, no DCGM_FI_PROF_GR_ENGINE_ACTIVE."""
    labels = 'gpu="0",UUID="GPU-m",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="n0"'
    text = "\n".join(
        [
            f'DCGM_FI_DEV_FB_USED{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"}} 1024',
            f'DCGM_FI_DEV_FB_USED{{{labels},GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"}} 1024',
            "",
        ]
    )
    (found,) = readings_from_exposition(text, at)
    assert not found.utilization_known
    return found


async def test_a_mig_gpu_held_for_an_hour_is_billed_its_allocation_but_no_use_or_idle_time() -> None:
    sampler = a_sampler(Published())
    for i in range(360):  # an hour of rounds every 10 s
        at = NOW + timedelta(seconds=10 * i)
        await _account(sampler, [mig_reading(at), replace(reading("GPU-a", 80.0), at=at)], at)
    rows = {key.gpu_uuid: row for key, row in sampler.ledger.accountant.rows.items()}
    mig, known = rows["GPU-m"], rows["GPU-a"]
    assert mig.allocated_gpu_hours == pytest.approx(1.0) and mig.cost == pytest.approx(4.0)
    assert mig.memory_mib_s == pytest.approx(2048 * 3600)
    assert (mig.used_gpu_s, mig.idle_gpu_s, mig.idle_pending_s, mig.idle_run_since) == (0.0, 0.0, 0.0, None)
    # a reading with its utilisation is counted as before
    assert known.allocated_gpu_hours == pytest.approx(1.0) and known.used_gpu_hours == pytest.approx(0.8)
    assert known.cost == pytest.approx(4.0)
    # rightsizing is not fed the unknown use as 0%
    assert {holder[0] for holder in sampler.ledger.rightsizing.holders()} == {"GPU-a"}


def unknown_share() -> list[Share]:
    return split_reading(0.0, 2048, [Holder("ns", "p", "main", "GPU-x", 500)])


def test_the_accountant_counts_allocation_memory_and_cost_of_a_reading_without_a_utilisation() -> None:
    accountant = Accountant(AccountingPolicy(interval_s=10.0, idle_window_s=60.0))
    for i in range(360):
        at = NOW + timedelta(seconds=10 * i)
        accountant.add("n0", "GPU-x", at, unknown_share(), {}, A100, None, False)
    (row,) = accountant.rows.values()
    assert row.allocated_gpu_hours == pytest.approx(0.5) and row.cost == pytest.approx(2.0)
    assert row.memory_mib_s == pytest.approx(2048 * 3600) and row.samples == 360
    assert (row.used_gpu_s, row.idle_gpu_s, row.idle_pending_s) == (0.0, 0.0, 0.0)  # 0% is not read
    (sums,) = accountant.take_sums().values()
    assert sums == pytest.approx([1800.0, 0.0, 0.0, 2.0])


def add(accountant: Accountant, at: datetime, util: float | None) -> None:
    shares = split_reading(util or 0.0, 100, [Holder("ns", "p", "main", "GPU-x")])
    accountant.add("n0", "GPU-x", at, shares, {}, A100, None, util is not None)


def test_an_idle_run_goes_on_through_an_occasional_unknown_reading_and_ends_after_a_long_stretch() -> None:
    policy = AccountingPolicy(interval_s=10.0, max_gap_s=30.0, idle_window_s=120.0)
    occasional, stretch = Accountant(policy), Accountant(policy)
    for i in range(30):  # five minutes idle, the source without a utilisation every sixth reading
        add(occasional, NOW + timedelta(seconds=10 * i), None if i % 6 == 5 else 1.0)
    (row,) = occasional.rows.values()
    assert row.idle_gpu_s == pytest.approx(250.0)  # the idle readings' time, not the unknown ones'
    for i in range(30):  # idle 1 min, 4 min without a utilisation, idle again: two runs under 2 min
        add(stretch, NOW + timedelta(seconds=10 * i), 1.0 if i < 6 or i > 29 - 6 else None)
    (row,) = stretch.rows.values()
    assert (row.idle_gpu_s, row.idle_pending_s) == (0.0, 60.0)  # the second run, not flagged yet
    assert row.allocated_gpu_s == pytest.approx(300.0) and row.used_gpu_s == pytest.approx(12 * 10 * 0.01)


async def test_a_reading_without_a_utilisation_is_not_published_as_a_sample() -> None:
    js = Published()
    known = reading("GPU-a", 80.0)
    await _publish_samples(
        SimpleNamespace(js=js),  # type: ignore[arg-type]
        [known, replace(known, gpu_uuid="GPU-b", utilization_pct=0.0, utilization_known=False)],
        NOW,
    )
    assert len(js.subjects) == 1
