"""A round's readings whose source had no utilisation (dcgm-exporter's NaN) in the sampler: they are
neither counted as usage (0% used, idle GPU time) nor published as samples, and the rest of the round
is."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from tessera.telemetry.domain.attributed import Attributed, AttributedGpu
from tessera.telemetry.domain.attribution import Holder, split_reading
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pricing import PriceBook
from tessera.telemetry.domain.rightsizing import RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.entrypoints.publishers import _account, _publish_samples
from tessera.telemetry.service_layer.usage import UsageLedger

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)


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
    ledger = UsageLedger(Accountant(), PriceBook(), RightsizingTracker())
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


async def test_a_reading_without_a_utilisation_is_not_counted_as_usage() -> None:
    sampler = a_sampler(Published())
    await _account(sampler, [reading("GPU-a", 80.0), reading("GPU-b", 0.0, known=False)], NOW)
    rows = sampler.ledger.accountant.rows
    assert {key.gpu_uuid for key in rows} == {"GPU-a"}
    assert sampler.ledger.accountant.stats.samples == 1


async def test_a_reading_without_a_utilisation_is_not_published_as_a_sample() -> None:
    js = Published()
    known = reading("GPU-a", 80.0)
    await _publish_samples(
        SimpleNamespace(js=js),  # type: ignore[arg-type]
        [known, replace(known, gpu_uuid="GPU-b", utilization_pct=0.0, utilization_known=False)],
        NOW,
    )
    assert len(js.subjects) == 1
