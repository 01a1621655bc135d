"""The simulated HPA follows upstream's algorithm: ceil(total / averageValue) with a 10% tolerance,
ceil(current * value / target) for a Value target, the largest proposal, stabilisation per direction
(scale-down keeps the largest recommendation of its window) and the replica bounds."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.devcluster.sim.hpa import (
    Stabiliser,
    desired_replicas,
    external_average_value_replicas,
    external_value_replicas,
    parse_quantity,
)


def spec(down_window: float | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "minReplicas": 1,
        "maxReplicas": 10,
        "metrics": [
            {
                "type": "External",
                "external": {
                    "metric": {"name": "load"},
                    "target": {"type": "AverageValue", "averageValue": "10"},
                },
            }
        ],
        **extra,
    }
    if down_window is not None:
        out["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": down_window}}
    return out


def test_average_value_gives_the_replicas_that_carry_the_total_within_tolerance() -> None:
    assert external_average_value_replicas(2, 45.0, 10.0) == 5
    assert external_average_value_replicas(4, 42.0, 10.0) == 4  # 42 / 40 = 1.05: within 10%
    assert external_average_value_replicas(4, 45.0, 10.0) == 5  # 1.125: outside
    assert external_average_value_replicas(0, 5.0, 10.0) == 1


def test_a_value_target_scales_by_the_ratio() -> None:
    assert external_value_replicas(3, 20.0, 10.0) == 6
    assert external_value_replicas(3, 10.5, 10.0) == 3


def test_quantities() -> None:
    assert parse_quantity("1500m") == 1.5 and parse_quantity("2") == 2.0 and parse_quantity("1Ki") == 1024


def test_scale_down_waits_for_its_window_and_scale_up_does_not() -> None:
    s = Stabiliser()
    hpa = spec(down_window=60)
    assert desired_replicas(hpa, 1, {"load": 80.0}, s, now=0.0) == 8  # up at once
    assert desired_replicas(hpa, 8, {"load": 20.0}, s, now=15.0) == 8  # 2 wanted; 8 seen 15 s ago
    assert desired_replicas(hpa, 8, {"load": 20.0}, s, now=45.0) == 8
    assert desired_replicas(hpa, 8, {"load": 20.0}, s, now=75.0) == 2  # the 8 left the window


def test_default_scale_down_window_is_five_minutes_and_bounds_apply() -> None:
    s = Stabiliser()
    assert desired_replicas(spec(), 1, {"load": 500.0}, s, now=0.0) == 10  # maxReplicas
    assert desired_replicas(spec(), 10, {"load": 1.0}, s, now=299.0) == 10
    assert desired_replicas(spec(), 10, {"load": 1.0}, s, now=301.0) == 1


def test_no_value_for_the_metric_keeps_the_count() -> None:
    assert desired_replicas(spec(), 3, {}, Stabiliser(), now=0.0) == 3


@pytest.mark.parametrize("bad", [0.0, -1.0])
def test_a_target_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        external_average_value_replicas(1, 1.0, bad)
