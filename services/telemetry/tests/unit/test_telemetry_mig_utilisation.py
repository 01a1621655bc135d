"""MIG instances read through dcgm-exporter: no DCGM_FI_DEV_GPU_UTIL, but the profiling field
DCGM_FI_PROF_GR_ENGINE_ACTIVE per instance (GPU_I_ID, GPU_I_PROFILE). Weighed by each instance's part
of the GPU it is the GPU's utilisation, and each holder is credited its own instance's (see
test_telemetry_mig_instances), so a MIG holder's used and idle GPU-hours are counted; only with
neither field is the reading's utilisation unknown."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tessera.telemetry.adapters.sources.dcgm import readings_from_exposition
from tessera.telemetry.domain.attributed import Attributed, AttributedGpu
from tessera.telemetry.domain.attribution import Holder, split_reading
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pricing import Flavor, PriceBook
from tessera.telemetry.domain.rightsizing import RightsizingTracker
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_rows import AccountingPolicy
from tessera.telemetry.entrypoints.publishers import _account
from tessera.telemetry.service_layer.usage import UsageLedger

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
GPU = 'gpu="0",UUID="GPU-m",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="n0"'


def exposition(*lines: str) -> str:
    return "\n".join([*lines, ""])


def instance(metric: str, gpu_i_id: int, profile: str, value: str, pod: str = "") -> str:
    held = f',namespace="ns",pod="{pod}",container="main"' if pod else ""
    return f'{metric}{{{GPU},GPU_I_PROFILE="{profile}",GPU_I_ID="{gpu_i_id}"{held}}} {value}'


def mig_reading(at: datetime, active: str, profile: str = "3g.40gb") -> Reading:
    """One GPU with one MIG instance held by pod `p`, as dcgm-exporter exports it: no
    DCGM_FI_DEV_GPU_UTIL."""
    text = exposition(
        instance("DCGM_FI_DEV_FB_USED", 1, profile, "2048", "p"),
        instance("DCGM_FI_DEV_FB_FREE", 1, profile, "38912", "p"),
        instance("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, profile, active, "p"),
    )
    (found,) = readings_from_exposition(text, at)
    return found


# -- the source ------------------------------------------------------------------------------------
def test_the_engine_activity_of_mig_instances_is_the_gpus_utilisation_weighed_by_their_slices() -> None:
    text = exposition(
        "# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge",
        instance("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, "3g.40gb", "0.5"),
        instance("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 2, "2g.20gb", "NaN"),  # no value: counts nothing
        instance("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 9, "1g.10gb", "1.0"),
        instance("DCGM_FI_DEV_FB_USED", 1, "3g.40gb", "1024"),
    )
    (reading,) = readings_from_exposition(text, NOW)
    assert reading.utilization_known and reading.model == "A100-80GB"
    assert reading.utilization_pct == pytest.approx(100.0 * (0.5 * 3 + 1.0 * 1) / 7)


def test_a_mig_gpu_without_the_engine_activity_or_with_nan_only_has_an_unknown_utilisation() -> None:
    for active in ("NaN", None):
        lines = [instance("DCGM_FI_DEV_FB_USED", 1, "3g.40gb", "1024")]
        if active is not None:
            lines.append(instance("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1, "3g.40gb", active))
        (reading,) = readings_from_exposition(exposition(*lines), NOW)
        assert not reading.utilization_known and reading.utilization_pct == 0.0


def test_the_gpu_utilisation_comes_first_and_a_whole_gpus_engine_activity_stands_in_for_it() -> None:
    both = exposition(f"DCGM_FI_DEV_GPU_UTIL{{{GPU}}} 80", f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{GPU}}} 0.25")
    engine_only = exposition(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{GPU}}} 0.25")
    assert readings_from_exposition(both, NOW)[0].utilization_pct == 80.0
    (reading,) = readings_from_exposition(engine_only, NOW)
    assert reading.utilization_known and reading.utilization_pct == pytest.approx(25.0)


# -- accounting ------------------------------------------------------------------------------------
class MigHolders:
    """PodResources as the kubelet answers it: pod `p` holds one 3g.40gb instance of each GPU."""

    async def attribute(
        self, readings: Sequence[Reading], placed_milli: Any = None, placements: int | None = None
    ) -> Attributed:
        return Attributed(
            gpus=[
                AttributedGpu(
                    r,
                    split_reading(
                        r.utilization_pct,
                        r.memory_used_mib,
                        [Holder("ns", "p", "main", r.gpu_uuid, None, "3g.40gb")],
                        None,
                        r.model,
                        r.mig_instances,
                    ),
                )
                for r in readings
            ]
        )


class Dropped:
    async def publish(self, subject: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        pass


def a_sampler() -> Any:
    ctx = SimpleNamespace(metrics=SimpleNamespace(registry=CollectorRegistry()), js=Dropped())
    prices = PriceBook((Flavor("a100", "A100-80GB", None, 7.0),))
    policy = AccountingPolicy(interval_s=10.0, idle_window_s=600.0)
    return SimpleNamespace(
        ctx=ctx,
        ledger=UsageLedger(Accountant(policy), prices, RightsizingTracker()),
        attributor=MigHolders(),
        attribution_problems={},
        sample_interval_s=10.0,
        usage_flush_s=1e9,
        currency="USD",
        source=SimpleNamespace(name="dcgm:n0"),
    )


async def an_hour(active: str) -> Any:
    sampler = a_sampler()
    for i in range(360):  # an hour of rounds every 10 s
        at = NOW + timedelta(seconds=10 * i)
        await _account(sampler, [mig_reading(at, active)], at)
    (row,) = sampler.ledger.accountant.rows.values()
    return row


async def test_a_busy_mig_instance_held_for_an_hour_counts_its_used_gpu_hours() -> None:
    row = await an_hour("0.6")
    assert row.allocated_gpu_hours == pytest.approx(3 / 7) and row.cost == pytest.approx(3.0)
    assert row.used_gpu_hours == pytest.approx(3 / 7 * 0.6)  # before: 0, the reading was unknown
    assert row.idle_gpu_s == 0.0


async def test_an_idle_mig_instance_held_for_an_hour_counts_its_idle_gpu_hours() -> None:
    row = await an_hour("0.01")
    assert row.used_gpu_hours == pytest.approx(3 / 7 * 0.01)
    assert row.idle_gpu_hours == pytest.approx(3 / 7)  # the whole run, once it reached the window
