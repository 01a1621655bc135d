"""Health, idleness and rollups from successive readings: the telemetry domain."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.telemetry.bootstrap import make_monitor
from tessera.telemetry.config import TelemetrySettings, UsageSettings
from tessera.telemetry.domain.health import BecameUnhealthy, Fault, HealthPolicy, HealthTracker, Recovered
from tessera.telemetry.domain.idle import BecameIdle, IdleEnded, IdlePolicy, IdleTracker
from tessera.telemetry.domain.model import Reading, with_health
from tessera.telemetry.domain.monitor import Monitor
from tessera.telemetry.domain.rollups import RollupBuilder, window_start

T0 = datetime(2026, 11, 21, 6, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reading(**overrides: Any) -> Reading:
    base = Reading(
        node="gpu-node-0",
        gpu_index=0,
        gpu_uuid="GPU-0",
        at=T0,
        utilization_pct=50.0,
        memory_used_mib=1000,
        power_w=200.0,
        temperature_c=60.0,
        model="A100-80GB",
        memory_total_mib=81920,
        power_limit_w=400.0,
        pods=("default/train-0",),
    )
    return replace(base, **overrides)


# -- health --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "faults"),
    [
        ({}, set()),
        ({"xid_errors": (79,)}, {Fault.XID}),
        ({"xid_errors": (13, 31, 43)}, set()),  # application faults, not broken hardware
        ({"ecc_uncorrected": 2}, {Fault.ECC}),
        ({"temperature_c": 96.0}, {Fault.TEMPERATURE}),
        ({"temperature_c": 89.9}, set()),
        ({"power_w": 450.0}, {Fault.POWER}),
        ({"power_w": 450.0, "power_limit_w": None}, set()),
        ({"lost": True, "temperature_c": 0.0}, {Fault.LOST}),
        ({"xid_errors": (48,), "ecc_uncorrected": 1}, {Fault.XID, Fault.ECC}),
    ],
)
def test_faults_read_from_one_reading(overrides: dict[str, Any], faults: set[Fault]) -> None:
    finding = HealthTracker().inspect(reading(**overrides))
    assert set(finding.faults) == faults


def test_a_hard_fault_trips_at_once_and_names_the_xid() -> None:
    tracker = HealthTracker()
    change = tracker.observe(reading(xid_errors=(79,)))
    assert isinstance(change, BecameUnhealthy)
    assert change.finding.xid == 79
    assert change.finding.faults[Fault.XID] == "XID 79 reported"
    assert tracker.unhealthy() == {"GPU-0"}


def test_heat_trips_only_after_readings_in_a_row() -> None:
    tracker = HealthTracker(HealthPolicy(trip_after=3))
    hot = [tracker.observe(reading(at=at(i), temperature_c=95.0)) for i in range(2)]
    assert hot == [None, None]
    assert tracker.observe(reading(at=at(2), temperature_c=60.0)) is None  # the streak is broken
    changes = [tracker.observe(reading(at=at(3 + i), temperature_c=95.0)) for i in range(3)]
    assert changes[:2] == [None, None] and isinstance(changes[2], BecameUnhealthy)


def test_a_flapping_gpu_is_reported_once_and_recovers_after_clean_readings() -> None:
    tracker = HealthTracker(HealthPolicy(trip_after=1, recover_after=3))
    temperatures = [95, 60, 95, 60, 60, 95, 60, 60, 60]
    changes = [tracker.observe(reading(at=at(i), temperature_c=float(t))) for i, t in enumerate(temperatures)]
    kinds = [type(c).__name__ for c in changes if c is not None]
    assert kinds == ["BecameUnhealthy", "Recovered"]
    assert isinstance(changes[-1], Recovered)
    assert tracker.unhealthy() == set()


def test_an_xid_reported_once_holds_the_gpu_faulty_for_the_hold_time() -> None:
    tracker = HealthTracker(HealthPolicy(xid_hold_s=60, recover_after=1))
    assert isinstance(tracker.observe(reading(at=at(0), xid_errors=(79,))), BecameUnhealthy)
    assert tracker.observe(reading(at=at(30))) is None  # no XID now, but within the hold
    assert isinstance(tracker.observe(reading(at=at(61))), Recovered)


def test_a_gpu_seeded_unhealthy_is_not_reported_again() -> None:
    tracker = HealthTracker()
    tracker.seed_unhealthy("GPU-0")
    assert tracker.observe(reading(xid_errors=(79,))) is None
    assert tracker.unhealthy() == {"GPU-0"}


def test_policy_rejects_zero_streaks() -> None:
    with pytest.raises(ValueError, match="trip_after and recover_after"):
        HealthPolicy(trip_after=0)


# -- idleness ------------------------------------------------------------------------------------------
def test_a_held_gpu_doing_nothing_is_idle_once_after_the_idle_time() -> None:
    tracker = IdleTracker(IdlePolicy(idle_after_s=20))
    changes = [tracker.observe(reading(at=at(t), utilization_pct=1.0)) for t in (0, 10, 20, 30)]
    assert changes[:2] == [None, None] and changes[3] is None
    idle = changes[2]
    assert isinstance(idle, BecameIdle)
    assert idle.idle_since == T0 and idle.mean_utilization_pct == 1.0
    assert tracker.idle() == {"GPU-0"}


@pytest.mark.parametrize(
    ("next_reading", "ends"),
    [
        ({"utilization_pct": 10.0}, False),  # between the thresholds: still idle (hysteresis)
        ({"utilization_pct": 40.0}, True),
        ({"pods": ()}, True),  # released
        ({"pods": ("default/other",)}, True),  # someone else holds it now
    ],
)
def test_idleness_ends_only_when_clearly_busy_or_released(next_reading: dict[str, Any], ends: bool) -> None:
    tracker = IdleTracker(IdlePolicy(idle_after_s=0))
    assert isinstance(tracker.observe(reading(utilization_pct=0.0)), BecameIdle)
    change = tracker.observe(reading(at=at(5), **next_reading))
    assert isinstance(change, IdleEnded) if ends else change is None


def test_unheld_or_unknown_gpus_are_never_idle() -> None:
    tracker = IdleTracker(IdlePolicy(idle_after_s=0))
    assert tracker.observe(reading(utilization_pct=0.0, pods=())) is None
    assert tracker.observe(reading(utilization_pct=0.0, pods=None)) is None
    assert tracker.idle() == set()


UNKNOWN = {"utilization_pct": 0.0, "utilization_known": False}


def test_readings_without_a_utilisation_neither_make_an_idle_stretch_nor_keep_one_long() -> None:
    """A reading whose source had no utilisation (utilization_pct 0.0, unknown) is not a low one."""
    tracker = IdleTracker(IdlePolicy(idle_after_s=100, max_unknown_s=30))
    assert [tracker.observe(reading(at=at(t), **UNKNOWN)) for t in (0, 10, 20, 30)] == [None] * 4
    assert tracker.idle() == set()
    assert tracker.observe(reading(at=at(40), utilization_pct=1.0)) is None  # a stretch starts at 40
    for t in (50, 60, 70, 80):  # and is broken: no utilisation for more than 30 s
        assert tracker.observe(reading(at=at(t), **UNKNOWN)) is None
    assert [tracker.observe(reading(at=at(t), utilization_pct=1.0)) for t in (90, 140)] == [None, None]
    idle = tracker.observe(reading(at=at(190), utilization_pct=1.0))
    assert isinstance(idle, BecameIdle) and idle.idle_since == at(90)  # it started again at 90
    assert tracker.observe(reading(at=at(500), **UNKNOWN)) is None  # reported idle stays so
    assert tracker.idle() == {"GPU-0"}


def test_the_service_keeps_an_idle_stretch_through_unknown_readings_as_long_as_usage_bridges_a_gap() -> None:
    settings = TelemetrySettings(sample_interval_s=5.0, usage=UsageSettings(max_gap_s=45.0))
    assert make_monitor(settings).idle.policy.max_unknown_s == 45.0


def test_an_idle_stretch_goes_on_through_an_occasional_reading_without_a_utilisation() -> None:
    """An exporter writing NaN once in a while does not keep an idle GPU from being reported."""
    tracker = IdleTracker(IdlePolicy(idle_after_s=600, max_unknown_s=30))
    changes = [
        tracker.observe(reading(at=at(t), **(UNKNOWN if t % 300 == 150 else {"utilization_pct": 1.0})))
        for t in range(0, 610, 10)
    ]
    assert [c for c in changes if c is not None] == [changes[-1]]
    assert isinstance(changes[-1], BecameIdle) and changes[-1].idle_since == at(0)


def test_idle_policy_thresholds_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="busy_above_pct"):
        IdlePolicy(idle_below_pct=20, busy_above_pct=10)


# -- rollups -------------------------------------------------------------------------------------------
def test_windows_are_ten_seconds_aligned_on_the_epoch() -> None:
    assert window_start(at(7.5)) == T0
    assert window_start(at(10)) == at(10)
    assert window_start(at(19.99)) == at(10)


def test_a_window_closes_with_mean_and_max_when_the_next_one_starts() -> None:
    builder = RollupBuilder()
    for t, util, temp in ((1, 20.0, 50.0), (4, 40.0, 70.0), (8, 60.0, 60.0)):
        assert builder.add("GPU-0", "n", 0, at(t), util, int(util * 10), util * 5, temp) is None
    closed = builder.add("GPU-0", "n", 0, at(12), 0.0, 0, 0.0, 30.0)
    assert closed is not None
    assert (closed.window_start, closed.samples) == (T0, 3)
    assert (closed.utilization_mean_pct, closed.utilization_max_pct) == (40.0, 60.0)
    assert (closed.memory_mean_mib, closed.memory_max_mib) == (400.0, 600)
    assert (closed.power_mean_w, closed.power_max_w) == (200.0, 300.0)
    assert (closed.temperature_mean_c, closed.temperature_max_c) == (60.0, 70.0)
    assert [r.window_start for r in builder.flush()] == [at(10)]


def test_readings_without_a_utilisation_are_left_out_of_the_windows_utilisation_not_read_as_0() -> None:
    """As used GPU-hours leave them out: the mean is that of the known readings, None when none is known."""
    monitor = Monitor.with_policies(HealthPolicy(), IdlePolicy())
    mixed = [reading(at=at(1), utilization_pct=20.0), reading(at=at(4), **UNKNOWN)]
    mixed.append(reading(at=at(8), utilization_pct=60.0))
    unknown = [reading(gpu_uuid="GPU-1", at=at(t), **UNKNOWN) for t in (1, 4)]
    monitor.observe([*mixed, *unknown], now=at(9))
    closed = {r.gpu_uuid: r for r in monitor.rollups.flush()}
    assert (closed["GPU-0"].samples, closed["GPU-0"].memory_mean_mib) == (3, 1000.0)
    assert (closed["GPU-0"].utilization_mean_pct, closed["GPU-0"].utilization_max_pct) == (40.0, 60.0)
    assert (closed["GPU-1"].samples, closed["GPU-1"].temperature_mean_c) == (2, 60.0)
    assert (closed["GPU-1"].utilization_mean_pct, closed["GPU-1"].utilization_max_pct) == (None, None)


def test_the_monitor_flushes_windows_of_gpus_that_went_silent() -> None:
    monitor = Monitor.with_policies(HealthPolicy(), IdlePolicy())
    assert monitor.observe([reading(at=at(1))], now=at(1)).rollups == []
    later = monitor.observe([reading(gpu_uuid="GPU-1", at=at(45))], now=at(45))
    assert [(r.gpu_uuid, r.window_start) for r in later.rollups] == [("GPU-0", T0)]


def test_the_monitor_reports_health_and_idleness_together_and_checkpoints() -> None:
    monitor = Monitor.with_policies(HealthPolicy(), IdlePolicy(idle_after_s=0))
    saved = monitor.checkpoint()
    out = monitor.observe(
        [reading(xid_errors=(79,)), reading(gpu_uuid="GPU-1", gpu_index=1, utilization_pct=0.0)], now=T0
    )
    assert [type(c).__name__ for c in out.health] == ["BecameUnhealthy"]
    assert [type(c).__name__ for c in out.idle] == ["BecameIdle"]
    assert saved.health.unhealthy() == set()  # the checkpoint did not move


def test_inventory_marks_the_gpus_found_unhealthy() -> None:
    gpus = [GpuInventory(index=i, uuid=f"GPU-{i}", model="T4", memory_mib=15360) for i in range(2)]
    nodes = [NodeInventory(name="n", cpu_milli=1000, memory_mib=1024, gpus=gpus)]
    marked = with_health(nodes, {"GPU-1"})
    assert [g.healthy for g in marked[0].gpus] == [True, False]
    assert with_health(nodes, set()) is nodes
