"""GPU memory-hours counted by the accountant for a known input, and the example price file read
through the loader telemetry uses for its price configuration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tessera.telemetry.config import PricingSettings
from tessera.telemetry.domain.attribution import Holder, split_reading
from tessera.telemetry.domain.directory import JobRef
from tessera.telemetry.domain.pricing import CapacityType, Pricing
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_report import GroupBy, totals
from tessera.telemetry.domain.usage_rows import AccountingPolicy

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
GPU = "GPU-aaaa"
A100 = Pricing("a100", CapacityType.ON_DEMAND, 4.0)
EXAMPLE_PRICES = Path(__file__).resolve().parents[4] / "examples" / "prices" / "aws-us-east-1.yaml"


def test_memory_hours_integrate_each_containers_memory_over_time() -> None:
    accountant = Accountant(AccountingPolicy(interval_s=10, max_gap_s=30))
    jobs = {("ns", "pod-a"): JobRef("job-a", "q", "team-a")}
    holders = [Holder("ns", "pod-a", "main", GPU, 1000)]
    # the first hour: 20 GiB held, a reading every 10 s
    for i in range(360):
        accountant.add(
            "n0", GPU, T0 + timedelta(seconds=10 * i), split_reading(50.0, 20480, holders), jobs, A100
        )
    # the second hour: 10 GiB, then a ten-minute gap that counts only max_gap_s
    second = T0 + timedelta(hours=1)
    for i in range(180):
        accountant.add(
            "n0", GPU, second + timedelta(seconds=10 * i), split_reading(50.0, 10240, holders), jobs, A100
        )
    accountant.add("n0", GPU, second + timedelta(minutes=40), split_reading(50.0, 10240, holders), jobs, A100)

    first_row, second_row = sorted(accountant.rows.values(), key=lambda r: r.key.window_start)
    assert first_row.memory_mib_s == pytest.approx(20480 * 3600)
    assert second_row.memory_mib_s == pytest.approx(10240 * (1800 + 30))
    (total,) = totals(accountant.rows.values(), GroupBy.TENANT)
    assert total.memory_gib_hours == pytest.approx(20.0 + 10.0 * 1830 / 3600)


def test_the_example_aws_prices_load_through_the_pricing_settings() -> None:
    book = PricingSettings(file=EXAMPLE_PRICES).price_book()
    assert book.currency == "USD"
    on_demand = book.pricing("A100-80GB")
    assert (on_demand.flavor, on_demand.capacity_type, on_demand.per_gpu_hour) == (
        "a100-80gb",
        CapacityType.ON_DEMAND,
        pytest.approx(40.9657 / 8, abs=1e-4),
    )
    spot = book.pricing("H100-80GB", {"karpenter.sh/capacity-type": "spot"})
    assert (spot.flavor, spot.capacity_type, spot.per_gpu_hour) == ("h100-80gb", CapacityType.SPOT, 4.916)
