"""The HPA controller's real sync period: the simulated period at the cluster's speed, with a floor."""

from __future__ import annotations

import pytest

from tessera.devcluster.cli import HPA_MIN_REAL_PERIOD_S, hpa_real_period


def test_the_simulated_period_is_divided_by_the_speed() -> None:
    assert hpa_real_period(15.0, 10.0) == pytest.approx(1.5)
    assert hpa_real_period(5.0, 1.0) == pytest.approx(5.0)


def test_a_fast_clock_does_not_make_the_controller_poll_flat_out() -> None:
    # 15 simulated seconds at a million times real time would be 15 µs between syncs
    assert hpa_real_period(15.0, 1e6) == HPA_MIN_REAL_PERIOD_S
    assert HPA_MIN_REAL_PERIOD_S > 15.0 / 1e6
