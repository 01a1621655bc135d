"""The usage series shaped from hourly sums: the busiest groups by allocated GPU-hours, the rest as
`other`, a point for every hour of the period (zeros where nothing was held). Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tessera.telemetry.domain.usage_series import OTHER, HourSum, shape_series

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
H = timedelta(hours=1)


def test_the_busiest_groups_and_the_rest_as_other_with_every_hour() -> None:
    sums = [
        HourSum(T0, "a", 7200, 3600, 0, 8.0),  # 2 GPUs allocated, 1 used
        HourSum(T0 + 2 * H, "a", 3600, 0, 3600, 4.0),
        HourSum(T0, "b", 1800, 900, 0, 2.0),
        HourSum(T0 + H, "c", 900, 0, 900, 1.0),
        HourSum(T0 + H, "d", 900, 90, 0, 1.0),
    ]
    a, b, other = shape_series(sums, T0 + timedelta(minutes=20), T0 + 3 * H, top=2)
    assert [p.hour for p in a.points] == [T0, T0 + H, T0 + 2 * H]
    assert [(p.allocated_gpus, p.used_gpus, p.idle_gpus) for p in a.points] == [
        (2.0, 1.0, 0.0),
        (0.0, 0.0, 0.0),
        (1.0, 0.0, 1.0),
    ]
    assert (a.group, a.allocated_gpu_hours, a.used_gpu_hours, a.cost) == ("a", 3.0, 1.0, 12.0)
    assert b.group == "b" and [p.allocated_gpus for p in b.points] == [0.5, 0.0, 0.0]
    assert other.group == OTHER  # c and d summed
    assert [(p.allocated_gpus, p.used_gpus, p.idle_gpus) for p in other.points] == [
        (0.0, 0.0, 0.0),
        (0.5, 0.025, 0.25),
        (0.0, 0.0, 0.0),
    ]
    assert other.cost == 2.0


def test_no_other_when_every_group_fits_and_top_must_be_positive() -> None:
    (only,) = shape_series([HourSum(T0, "a", 3600, 0, 0, 1.0)], T0, T0 + H, top=5)
    assert only.group == "a"
    assert shape_series([], T0, T0 + H, top=5) == []
    with pytest.raises(ValueError, match="top"):
        shape_series([], T0, T0 + H, top=0)
