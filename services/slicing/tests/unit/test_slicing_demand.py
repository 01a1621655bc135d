"""The demand window (60 s, or 10 s idle), demand shapes, and time-slicing replicas from milli demand."""

from __future__ import annotations

import math
import random

import pytest

from tessera.slicing.domain.demand import (
    DemandWindow,
    ForecastDemand,
    GangBlocked,
    GpuIdleSignal,
    InvalidDemand,
    PendingDemand,
    PodShape,
    ShapeKind,
)
from tessera.slicing.domain.time_slicing import choose_replicas, pack_by_usage, pack_shares

MIG_3G = PodShape.mig("3g.40gb")
ONE_GPU = PodShape.whole()


def test_a_burst_closes_once_after_ten_quiet_seconds() -> None:
    window = DemandWindow()
    for t in range(0, 9, 2):
        window.add(PendingDemand(float(t), ((MIG_3G, t + 1),)))
        assert not window.due(float(t) + 9.9)
    assert window.next_due() == 18.0
    assert window.close(17.0) is None
    batch = window.close(18.0)
    assert batch is not None
    assert batch.pending == {MIG_3G: 9}  # the newest snapshot, not the sum of five
    assert batch.signals == 5 and batch.opened_at == 0.0
    assert not window.is_open and window.close(100.0) is None


def test_a_steady_trickle_still_closes_at_sixty_seconds() -> None:
    window = DemandWindow()
    for t in range(0, 70, 5):
        window.add(GangBlocked(float(t), f"job-{t}", ((ONE_GPU, 1),)))
        if window.due(float(t)):
            break
    assert t == 60
    batch = window.close(60.0)
    assert batch is not None and batch.pending == {ONE_GPU: 13}


def test_repeats_open_a_window_but_do_not_hold_it_open() -> None:
    """A forecast republished every second with the same demand, as the forecaster does each step,
    no longer keeps a MIG pod's plan waiting the whole 60 s: 10 s after the last new input it closes."""
    window = DemandWindow()
    same = (("A100-80GB", 0.0),)
    window.add(ForecastDemand(0.0, same))  # opens the window
    window.add(GangBlocked(2.0, "default/wants-3g", ((MIG_3G, 1),)))
    window.add(PendingDemand(2.0, ((MIG_3G, 1),)))
    for t in range(3, 30):
        window.add(ForecastDemand(float(t), same))
        window.add(PendingDemand(float(t), ((MIG_3G, 1),)))  # the same snapshot again
        window.add(GangBlocked(float(t), "default/wants-3g", ((MIG_3G, 1),)))  # ignored: in the snapshot
        window.add(GpuIdleSignal(float(t), "n1", 0, 1.0 + t / 100))  # n1's GPU 0 is new only once
        if window.due(float(t)):
            break
    assert t == 13  # 10 s after the last new input (n1's GPU 0 idle, at 3 s), not at 60 s
    batch = window.close(13.0)
    assert batch is not None and batch.pending == {MIG_3G: 1} and batch.signals == 3 + 4 * 11
    # a repeat still opens the next window, so what waits is planned again
    window.add(ForecastDemand(40.0, same))
    assert window.is_open and window.next_due() == 50.0


def test_inputs_that_change_the_demand_hold_the_window_open() -> None:
    window = DemandWindow()
    window.add(PendingDemand(0.0, ((MIG_3G, 1),)))
    changes = [
        PendingDemand(8.0, ((MIG_3G, 2),)),  # other counts
        GangBlocked(16.0, "a", ((ONE_GPU, 1),)),  # a gang newer than the snapshot
        GangBlocked(24.0, "a", ((ONE_GPU, 2),)),  # the same gang on other shapes
        ForecastDemand(32.0, (("3g.40gb", 0.4),)),  # a first forecast
        ForecastDemand(40.0, (("3g.40gb", 0.9),)),  # 1 instance, then 3: other pod counts
        GpuIdleSignal(48.0, "n1", 0, 0.5),
    ]
    for signal in changes:
        assert not window.due(signal.at)
        window.add(signal)
    assert window.next_due() == 58.0
    # a forecast whose value moves but asks for the same pods is a repeat
    window.add(ForecastDemand(50.0, (("3g.40gb", 0.95),)))
    assert window.next_due() == 58.0


def test_gangs_already_in_a_snapshot_are_not_counted_twice() -> None:
    window = DemandWindow()
    window.add(GangBlocked(1.0, "a", ((ONE_GPU, 2),)))
    window.add(PendingDemand(2.0, ((ONE_GPU, 2),)))
    window.add(GangBlocked(3.0, "b", ((MIG_3G, 1),)))
    batch = window.close(20.0)
    assert batch is not None and batch.pending == {ONE_GPU: 2, MIG_3G: 1}


def test_forecasts_raise_demand_and_idle_gpus_are_kept() -> None:
    window = DemandWindow()
    window.add(PendingDemand(0.0, ((MIG_3G, 1),)))
    window.add(ForecastDemand(1.0, (("3g.40gb", 1.2), ("A100-80GB", 2.5), ("unknown", 4.0))))
    window.add(GpuIdleSignal(2.0, "n1", 3, 0.5))
    batch = window.close(12.0)
    assert batch is not None
    # 1.2 GPU-equivalents of a 3/7 profile is 3 instances; 2.5 GPUs of a model is 3 whole GPUs
    assert batch.demand() == {MIG_3G: 3, PodShape.whole(models=("A100-80GB",)): 3}
    assert batch.idle_gpus == {("n1", 3): 0.5}


def test_bad_demand_names_the_field() -> None:
    with pytest.raises(InvalidDemand, match=r"shape\.milli"):
        PodShape.share(0)
    with pytest.raises(InvalidDemand, match=r"shape\.gpus"):
        PodShape(gpus=2, milli=500)
    with pytest.raises(ValueError, match="not of the form"):
        PodShape.mig("big")
    with pytest.raises(InvalidDemand, match="pods must be >= 0"):
        PendingDemand(0.0, ((ONE_GPU, -1),))
    with pytest.raises(InvalidDemand, match="forecast"):
        ForecastDemand(0.0, (("A100-80GB", float("nan")),))
    with pytest.raises(InvalidDemand, match="window"):
        DemandWindow(window_s=0)
    assert PodShape.share(500).kind is ShapeKind.FRACTIONAL and MIG_3G.kind is ShapeKind.MIG


def test_replicas_follow_the_shares() -> None:
    assert choose_replicas([]).gpus == 0
    halves = choose_replicas([500] * 6)
    assert (halves.gpus, halves.replicas) == (3, 2)
    tenths = choose_replicas([100] * 20)
    assert (tenths.gpus, tenths.replicas) == (2, 10)
    capped = choose_replicas([50] * 40, max_replicas=8)
    assert (capped.gpus, capped.replicas) == (5, 8)


def test_packing_respects_both_limits_and_stays_near_the_bound() -> None:
    rng = random.Random(9)
    shares = [rng.choice([50, 100, 200, 250, 300, 500, 700]) for _ in range(400)]
    choice = choose_replicas(shares)
    assert sorted(s for b in choice.bins for s in b) == sorted(shares)
    assert all(sum(b) <= 1000 and len(b) <= choice.replicas for b in choice.bins)
    assert choice.gpus <= math.ceil(1.05 * choice.lower_bound) + 1
    with pytest.raises(ValueError, match=r"milli\[0\]"):
        pack_shares([0], 4)


def test_pods_whose_peaks_miss_each_other_share_a_gpu() -> None:
    morning = [80.0] * 10 + [5.0] * 10
    evening = [5.0] * 10 + [80.0] * 10
    packed = pack_by_usage([morning, evening, morning], max_pods_per_gpu=8)
    assert sorted(packed.gpus) == [(0, 1), (2,)]  # two mornings would reach 160 %
    assert pack_by_usage([morning, evening], max_pods_per_gpu=1).gpus == ((0,), (1,))
    lenient = pack_by_usage([morning, morning], max_pods_per_gpu=8, overload_budget=0.6)
    assert lenient.gpus == ((0, 1),)


def test_pods_stay_where_they_fit_and_light_gpus_are_emptied() -> None:
    quiet = [5.0] * 20
    stay = pack_by_usage([quiet, quiet, quiet], 8, current=["g1", "g1", "g2"])
    assert stay.gpus == ((0, 1, 2),) and stay.moves == 1  # g2's one pod joins g1
    busy = [90.0] * 20
    split = pack_by_usage([busy, busy], 8, current=["g1", "g1"])
    assert len(split.gpus) == 2 and split.moves == 1
    with pytest.raises(ValueError, match="same minutes"):
        pack_by_usage([[1.0], [1.0, 2.0]], 8)


def test_with_a_half_life_a_busy_spell_long_past_stops_holding_pods_apart() -> None:
    spell = [90.0] * 10 + [5.0] * 110  # busy two hours ago, quiet since
    assert len(pack_by_usage([spell, spell], 8, overload_budget=0.02).gpus) == 2
    assert len(pack_by_usage([spell, spell], 8, overload_budget=0.02, half_life_minutes=15).gpus) == 1
    recent = [5.0] * 110 + [90.0] * 10  # a recent spell still does
    assert len(pack_by_usage([recent, recent], 8, overload_budget=0.02, half_life_minutes=15).gpus) == 2
    with pytest.raises(ValueError, match="half_life_minutes"):
        pack_by_usage([spell], 8, half_life_minutes=0)
