"""Usage accounting, attribution of shared GPUs, idle windows, prices and rightsizing: the pure domain."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tessera.telemetry.domain.attribution import (
    SPLIT_MEMORY,
    SPLIT_REQUESTED,
    UNKNOWN,
    DeviceGrant,
    GpuProcess,
    Holder,
    holders_from_grants,
    split_reading,
)
from tessera.telemetry.domain.directory import JobDirectory, JobRef, PlacedPod, PodKey
from tessera.telemetry.domain.pricing import CapacityType, Flavor, PriceBook, Pricing, capacity_type_of
from tessera.telemetry.domain.rightsizing import (
    FindingKind,
    RightsizingPolicy,
    RightsizingTracker,
    recommended_milli,
    smallest_mig_profile,
)
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_report import GroupBy, totals
from tessera.telemetry.domain.usage_rows import AccountingPolicy

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
GPU = "GPU-aaaa"
A100 = Pricing("a100", CapacityType.ON_DEMAND, 4.0)


def holder(pod: str, milli: int | None = 1000, **kw: object) -> Holder:
    return Holder("team-a", pod, "main", GPU, milli, **kw)  # type: ignore[arg-type]


# ---- attribution ---------------------------------------------------------------------------------


def test_a_gpu_held_by_one_container_is_all_its_own() -> None:
    (share,) = split_reading(60.0, 1000, [holder("solo")])
    assert (share.allocated_gpus, share.used_gpus, share.memory_mib, share.split) == (
        1.0,
        0.6,
        1000,
        SPLIT_REQUESTED,
    )


def test_a_shared_gpu_is_split_by_process_memory_when_every_process_has_a_holding_pod() -> None:
    holders = [holder("small", 300), holder("large", 700)]
    processes = [GpuProcess(1, 2000, "team-a/small"), GpuProcess(2, 6000, "team-a/large")]
    small, large = split_reading(80.0, 8000, holders, processes)
    assert small.split == large.split == SPLIT_MEMORY
    assert small.used_gpus == pytest.approx(0.8 * 0.25) and large.used_gpus == pytest.approx(0.8 * 0.75)
    assert (small.memory_mib, large.memory_mib) == (2000, 6000)
    assert (small.allocated_gpus, large.allocated_gpus) == (0.3, 0.7)  # held is what was placed


def test_a_shared_gpu_is_split_by_requested_share_when_a_process_has_no_known_pod() -> None:
    holders = [holder("small", 250), holder("large", 750)]
    processes = [GpuProcess(1, 2000, "team-a/small"), GpuProcess(2, 6000, None)]
    small, large = split_reading(40.0, 8000, holders, processes)
    assert small.split == large.split == SPLIT_REQUESTED
    assert small.used_gpus == pytest.approx(0.1) and large.used_gpus == pytest.approx(0.3)
    assert small.memory_mib == pytest.approx(2000)


def test_replicas_without_a_placement_share_the_gpu_equally() -> None:
    grants = [
        DeviceGrant("ns", "a", "c", "nvidia.com/gpu", f"{GPU}::0"),
        DeviceGrant("ns", "b", "c", "nvidia.com/gpu", f"{GPU}::1"),
    ]
    by_gpu, unresolved = holders_from_grants(grants)
    assert unresolved == [] and [h.replica for h in by_gpu[GPU]] == [True, True]
    a, b = split_reading(50.0, 100, by_gpu[GPU])
    assert a.allocated_gpus == b.allocated_gpus == 0.5 and a.used_gpus == pytest.approx(0.25)


def test_mig_devices_find_their_gpu_and_hold_their_profiles_compute_share() -> None:
    grants = [
        DeviceGrant("ns", "a", "c", "nvidia.com/mig-3g.40gb", "MIG-1"),
        DeviceGrant("ns", "b", "c", "nvidia.com/mig-1g.10gb", "MIG-2"),
        DeviceGrant("ns", "c", "c", "nvidia.com/mig-1g.10gb", "MIG-unknown"),
    ]
    by_gpu, unresolved = holders_from_grants(grants, {"MIG-1": GPU, "MIG-2": GPU})
    assert [g.device_id for g in unresolved] == ["MIG-unknown"]
    a, b = split_reading(70.0, 30000, by_gpu[GPU], model="A100-80GB")
    assert a.allocated_gpus == pytest.approx(3 / 7) and b.allocated_gpus == pytest.approx(1 / 7)
    assert a.used_gpus + b.used_gpus == pytest.approx(0.7)


def test_the_scheduler_placed_share_wins_over_replica_guessing() -> None:
    grants = [DeviceGrant("ns", "a", "c", "nvidia.com/gpu", f"{GPU}::0")]
    by_gpu, _ = holders_from_grants(grants, placed_milli=lambda ns, pod, uuid: 400 if pod == "a" else None)
    assert by_gpu[GPU][0].milli == 400


def test_use_of_a_gpu_nobody_holds_goes_to_unknown_and_an_idle_free_gpu_to_nobody() -> None:
    (share,) = split_reading(30.0, 500, [])
    assert (share.pod, share.allocated_gpus, share.used_gpus) == (UNKNOWN, 0.0, 0.3)
    assert split_reading(0.0, 0, []) == []


# ---- accounting ------------------------------------------------------------------------------------


def run(
    accountant: Accountant,
    utils: list[float],
    pod: str = "solo",
    start: datetime = T0,
    step_s: float = 10,
    jobs: dict[PodKey, JobRef] | None = None,
) -> None:
    jobs = jobs if jobs is not None else {("team-a", pod): JobRef("job-1", "q", "tenant-a")}
    for i, util in enumerate(utils):
        at = start + timedelta(seconds=step_s * i)
        accountant.add("n0", GPU, at, split_reading(util, 1000, [holder(pod)]), jobs, A100)


def test_allocated_used_and_cost_integrate_over_time() -> None:
    accountant = Accountant(AccountingPolicy(interval_s=10))
    run(accountant, [50.0] * 360)  # one hour of readings every 10 s, half busy
    (row,) = accountant.rows.values()
    assert row.allocated_gpu_hours == pytest.approx(1.0)
    assert row.used_gpu_hours == pytest.approx(0.5)
    assert row.cost == pytest.approx(4.0)  # one GPU-hour at 4.0 per GPU-hour
    assert (row.job_id, row.queue, row.tenant, row.flavor) == ("job-1", "q", "tenant-a", "a100")


def test_a_gap_is_capped_so_an_outage_is_not_billed_as_use() -> None:
    accountant = Accountant(AccountingPolicy(interval_s=10, max_gap_s=30))
    accountant.add("n0", GPU, T0, split_reading(100, 0, [holder("solo")]), {}, A100)
    accountant.add("n0", GPU, T0 + timedelta(minutes=10), split_reading(100, 0, [holder("solo")]), {}, A100)
    (row,) = accountant.rows.values()
    assert row.allocated_gpu_s == pytest.approx(10 + 30)


def test_replaying_a_window_counts_nothing_twice() -> None:
    accountant = Accountant()
    run(accountant, [20.0] * 100)
    first = {k: (r.allocated_gpu_s, r.used_gpu_s, r.samples) for k, r in accountant.rows.items()}
    run(accountant, [20.0] * 100)  # the same readings again
    assert {k: (r.allocated_gpu_s, r.used_gpu_s, r.samples) for k, r in accountant.rows.items()} == first
    assert accountant.stats.duplicates == 100

    restarted = Accountant()  # after a restart, from the stored rows of the open hour
    restarted.restore([r for r in accountant.rows.values()], None)
    run(restarted, [20.0] * 100)
    assert {k: (r.allocated_gpu_s, r.used_gpu_s, r.samples) for k, r in restarted.rows.items()} == first


def test_readings_of_a_closed_hour_are_late_and_refused() -> None:
    accountant = Accountant(AccountingPolicy(close_after_s=60, idle_window_s=600))
    run(accountant, [20.0] * 5)
    accountant.dirty()
    assert accountant.close(T0 + timedelta(hours=1, minutes=10)) == []  # an idle run may reach back
    closed = accountant.close(T0 + timedelta(hours=1, minutes=11))
    assert len(closed) == 1 and accountant.rows == {}
    run(accountant, [20.0] * 5)
    assert accountant.rows == {} and accountant.stats.late == 5


def test_idle_time_counts_only_for_runs_longer_than_the_window_and_then_whole() -> None:
    accountant = Accountant(AccountingPolicy(interval_s=10, idle_window_s=600, idle_below_pct=5))
    run(accountant, [1.0] * 30)  # 5 minutes idle: not yet
    (row,) = accountant.rows.values()
    assert row.idle_gpu_s == 0
    run(accountant, [50.0], start=T0 + timedelta(seconds=300))  # busy: the run ends
    run(accountant, [1.0] * 61, start=T0 + timedelta(seconds=310))  # 10 minutes idle: the whole run
    assert row.idle_gpu_s == pytest.approx(610)
    run(accountant, [1.0] * 6, start=T0 + timedelta(seconds=920))  # and on, as it stays idle
    assert row.idle_gpu_s == pytest.approx(670)


def test_an_idle_run_across_the_hour_credits_each_hour_its_own_idle_seconds() -> None:
    accountant = Accountant(AccountingPolicy(interval_s=10, idle_window_s=600, idle_below_pct=5))
    start = T0 + timedelta(minutes=55)  # idle from 10:55, flagged at 11:05
    run(accountant, [1.0] * 48, start=start)  # to 11:02:50
    assert accountant.close(T0 + timedelta(hours=1, minutes=3)) == []  # 10:00 is still held
    run(accountant, [1.0] * 22, start=start + timedelta(seconds=480))  # to 11:06:30: flagged
    for row in accountant.dirty():
        assert row.idle_gpu_s <= row.allocated_gpu_s
    by_hour = {r.key.window_start: r for r in accountant.rows.values()}
    assert by_hour[T0].idle_gpu_s == pytest.approx(300) == by_hour[T0].allocated_gpu_s
    assert by_hour[T0 + timedelta(hours=1)].idle_gpu_s == pytest.approx(400)


def test_unknown_pods_are_billed_to_unknown_and_counted() -> None:
    accountant = Accountant()
    run(accountant, [10.0] * 3, pod="stray", jobs={})
    (row,) = accountant.rows.values()
    assert (row.job_id, row.tenant, row.queue) == (UNKNOWN, UNKNOWN, UNKNOWN)
    assert accountant.stats.unknown_pod_shares == 3


def test_a_pod_read_before_its_placement_arrived_is_billed_to_its_job_once_it_is_known() -> None:
    accountant = Accountant()
    run(accountant, [10.0] * 3, pod="late", jobs={})
    run(
        accountant,
        [10.0] * 3,
        pod="late",
        start=T0 + timedelta(seconds=30),
        jobs={("team-a", "late"): JobRef("job-9", "q", "tenant-b")},
    )
    (row,) = accountant.rows.values()
    assert (row.job_id, row.queue, row.tenant) == ("job-9", "q", "tenant-b")
    assert row.samples == 6


def test_a_pod_placed_before_its_job_was_announced_is_billed_to_the_tenant_once_it_is_known() -> None:
    """`gang_placed` and `job_accepted` come on different streams: the placement may be read first."""
    directory = JobDirectory()
    directory.place([PlacedPod("w-0", "job-7", "n0", {GPU: 1000})])
    accountant = Accountant()
    run(accountant, [10.0] * 3, pod="w-0", jobs=directory.refs())
    (row,) = accountant.rows.values()
    assert (row.job_id, row.tenant) == ("job-7", UNKNOWN)
    directory.add_job("job-7", tenant="team-b", queue="serving")
    run(accountant, [10.0] * 3, pod="w-0", start=T0 + timedelta(seconds=30), jobs=directory.refs())
    assert (row.job_id, row.queue, row.tenant) == ("job-7", "serving", "team-b")
    assert {t.group for t in totals(accountant.rows.values(), GroupBy.TENANT)} == {"team-b"}


def test_a_node_clock_far_off_is_clamped_and_reported() -> None:
    accountant = Accountant(AccountingPolicy(max_skew_s=30))
    shares = split_reading(10, 0, [holder("solo")])
    accountant.add("n0", GPU, T0 + timedelta(minutes=5), shares, {}, A100, now=T0)
    accountant.add("n1", "GPU-b", T0 + timedelta(seconds=3), shares, {}, A100, now=T0)
    assert accountant.stats.clamped == 1
    assert accountant.stats.worst_skew_s == {"n0": 300.0, "n1": 3.0}
    assert {r.last_at for r in accountant.rows.values()} == {T0, T0 + timedelta(seconds=3)}


def test_totals_group_rows_by_tenant_queue_job_or_flavor() -> None:
    accountant = Accountant()
    jobs = {("team-a", "a"): JobRef("job-a", "q1", "t1"), ("team-a", "b"): JobRef("job-b", "q2", "t2")}
    for i in range(10):
        at = T0 + timedelta(seconds=10 * i)
        accountant.add("n0", GPU, at, split_reading(50, 0, [holder("a", 500), holder("b", 500)]), jobs, A100)
    by_tenant = {t.group: t for t in totals(accountant.rows.values(), GroupBy.TENANT)}
    assert set(by_tenant) == {"t1", "t2"}
    assert by_tenant["t1"].allocated_gpu_hours == pytest.approx(50 / 3600)
    assert by_tenant["t1"].used_gpu_hours == pytest.approx(25 / 3600)
    (by_job,) = [t for t in totals(accountant.rows.values(), GroupBy.JOB) if t.group == "job-b"]
    assert (by_job.tenant, by_job.queue) == ("t2", "q2")


# ---- prices ----------------------------------------------------------------------------------------

BOOK = PriceBook(
    (
        Flavor("a100-spot", "A100-80GB", CapacityType.SPOT, 4.10, 1.50),
        Flavor("a100", "A100-80GB", None, 4.10, 1.60),
        Flavor("h100", "H100-80GB", None, 6.88, None),
    )
)


def test_a_node_is_priced_by_its_model_and_capacity_type() -> None:
    assert BOOK.pricing("A100-80GB", {"karpenter.sh/capacity-type": "spot"}) == Pricing(
        "a100-spot", CapacityType.SPOT, 1.50
    )
    assert BOOK.pricing("A100-80GB", {"karpenter.sh/capacity-type": "on-demand"}) == Pricing(
        "a100", CapacityType.ON_DEMAND, 4.10
    )
    assert BOOK.pricing("A100-80GB").per_gpu_hour == 4.10  # no label: on-demand
    # spot without a spot price falls back to the on-demand price
    assert BOOK.pricing("H100-80GB", {"cloud.google.com/gke-spot": "true"}).per_gpu_hour == 6.88
    assert BOOK.pricing("T4") == Pricing("T4", CapacityType.ON_DEMAND, 0.0)


def test_capacity_type_labels_of_karpenter_eks_gke_and_aks() -> None:
    assert capacity_type_of({"eks.amazonaws.com/capacityType": "SPOT"}) is CapacityType.SPOT
    assert capacity_type_of({"eks.amazonaws.com/capacityType": "ON_DEMAND"}) is CapacityType.ON_DEMAND
    assert capacity_type_of({"kubernetes.azure.com/scalesetpriority": "spot"}) is CapacityType.SPOT
    assert capacity_type_of({}) is None


def test_cost_of_a_half_share_on_spot_for_two_hours() -> None:
    accountant = Accountant()
    spot = BOOK.pricing("A100-80GB", {"karpenter.sh/capacity-type": "spot"})
    for i in range(720):
        at = T0 + timedelta(seconds=10 * i)
        accountant.add("n0", GPU, at, split_reading(10, 0, [holder("p", 500)]), {}, spot)
    assert sum(r.cost for r in accountant.rows.values()) == pytest.approx(0.5 * 2 * 1.50)


# ---- rightsizing -----------------------------------------------------------------------------------


def test_the_smallest_mig_profile_that_fits_memory_and_compute() -> None:
    assert smallest_mig_profile("A100-80GB", 9000, 0.1).name == "1g.10gb"  # type: ignore[union-attr]
    assert smallest_mig_profile("A100-80GB", 15000, 0.1).name == "1g.20gb"  # type: ignore[union-attr]
    assert smallest_mig_profile("A100-80GB", 15000, 0.25).name == "2g.20gb"  # type: ignore[union-attr]
    assert smallest_mig_profile("A100-80GB", 30000, 0.3).name == "3g.40gb"  # type: ignore[union-attr]
    assert smallest_mig_profile("T4", 1000, 0.1) is None  # no MIG


def test_recommended_milli_covers_p95_use_and_memory_with_headroom() -> None:
    policy = RightsizingPolicy(headroom=1.2, step_milli=50)
    assert recommended_milli(20.0, 4096, 81920, policy) == 250  # 20% x 1.2 = 240 -> 250
    assert recommended_milli(5.0, 40960, 81920, policy) == 600  # memory: 0.5 x 1.2 = 600
    assert recommended_milli(95.0, 0, 81920, policy) == 1000


def observe(
    tracker: RightsizingTracker, minutes: int, used: float, memory: float, allocated: float = 1.0
) -> list:
    out = []
    for i in range(minutes * 6):
        at = T0 + timedelta(seconds=10 * i)
        out += tracker.observe(
            "n0", GPU, "A100-80GB", 81920, "team-a", "p", "main", at, allocated, used, memory
        )
    return out


def test_a_pod_using_a_fifth_of_a_whole_gpu_gets_a_smaller_share_and_a_mig_profile_once() -> None:
    tracker = RightsizingTracker(RightsizingPolicy(window_s=1800, min_samples=30))
    found = observe(tracker, 130, used=0.2, memory=8000)
    (rec,) = [r for r in found if r.kind is FindingKind.FITS_SMALLER_SHARE]
    assert rec.allocated_milli == 1000 and rec.recommended_milli == 250
    assert rec.recommended_mig_profile == "2g.20gb"  # 20% x 1.2 > 1/7 of the compute
    assert rec.saving_gpu_hours_per_day == pytest.approx(0.75 * 24)
    assert rec.p95_utilization_pct == 20.0


def test_a_whole_gpu_under_ten_percent_for_hours_is_reported() -> None:
    tracker = RightsizingTracker(
        RightsizingPolicy(window_s=1800, min_samples=30, whole_gpu_window_s=2 * 3600)
    )
    found = observe(tracker, 60 * 3, used=0.03, memory=2000)
    kinds = [r.kind for r in found]
    assert (
        kinds.count(FindingKind.WHOLE_GPU_UNDERUSED) == 1 and kinds.count(FindingKind.FITS_SMALLER_SHARE) == 1
    )
    (whole,) = [r for r in found if r.kind is FindingKind.WHOLE_GPU_UNDERUSED]
    assert (whole.window_end - whole.window_start) >= timedelta(hours=2)
    assert whole.recommended_mig_profile == "1g.10gb"


def test_a_busy_pod_gets_no_recommendation() -> None:
    tracker = RightsizingTracker(RightsizingPolicy(window_s=1800, min_samples=30))
    assert observe(tracker, 120, used=0.9, memory=60000) == []
