"""A MIG GPU read through dcgm-exporter is attributed per instance: each holder uses what the instance
it holds used (its DCGM_FI_PROF_GR_ENGINE_ACTIVE times its slices over the GPU's, at most its
allocation), never its neighbours'; an instance without the field is unknown for its holder alone,
and the use no holder accounts for goes to the `unknown` pod, so the GPU's total stays the fleet's.

Before, the instances' activity was summed into one figure for the GPU and shared among its holders
by allocation: an idle 1g pod beside a busy 4g instance of an A100 was credited the busy one's use
(4x its allocation alone, 80 % busy beside the 4g pod) and never found idle."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.telemetry.adapters.attribution import PodResourcesAttributor
from tessera.telemetry.adapters.sources.dcgm import readings_from_exposition
from tessera.telemetry.domain.attributed import AttributedGpu
from tessera.telemetry.domain.attribution import UNKNOWN, Holder, Share, split_reading
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pod_usage import node_batches
from tessera.telemetry.domain.pricing import Flavor, PriceBook
from tessera.telemetry.domain.usage import Accountant
from tessera.telemetry.domain.usage_rows import AccountingPolicy

NOW = datetime(2026, 11, 23, 6, 0, tzinfo=UTC)
UUID = "GPU-m"
GPU = f'gpu="0",UUID="{UUID}",device="nvidia0",modelName="NVIDIA A100-SXM4-80GB",Hostname="n0"'
IDLE_1G = (1, "1g.10gb", "a")  # GPU_I_ID, profile, pod (namespace ns)
BUSY_4G = (2, "4g.40gb", "b")


def series(metric: str, inst: tuple[int, str, str], value: str) -> str:
    gpu_i_id, profile, pod = inst
    where = f'GPU_I_PROFILE="{profile}",GPU_I_ID="{gpu_i_id}",namespace="ns",pod="{pod}",container="main"'
    return f"{metric}{{{GPU},{where}}} {value}"


def mig_reading(at: datetime, active: dict[int, str]) -> Reading:
    """An A100 with an idle 1g instance (pod a) and a busy 4g one (pod b), as dcgm-exporter exports
    them with its Kubernetes mapping; `active` gives each instance's engine activity (none: not
    exported)."""
    lines = []
    for inst in (IDLE_1G, BUSY_4G):
        lines.append(series("DCGM_FI_DEV_FB_USED", inst, "1024"))
        lines.append(series("DCGM_FI_DEV_FB_FREE", inst, "9216"))
        if inst[0] in active:
            lines.append(series("DCGM_FI_PROF_GR_ENGINE_ACTIVE", inst, active[inst[0]]))
    (found,) = readings_from_exposition("\n".join([*lines, ""]), at)
    return found


def held(*pods: str) -> list[Holder]:
    """The holders PodResources names: pod a the 1g device, pod b the 4g one."""
    profiles = {"a": "1g.10gb", "b": "4g.40gb"}
    return [Holder("ns", pod, "main", UUID, None, profiles[pod]) for pod in pods]


def split(r: Reading, holders: Sequence[Holder]) -> dict[str, Share]:
    shares = split_reading(
        r.utilization_pct, r.memory_used_mib, holders, r.processes, r.model, r.mig_instances
    )
    assert sum(s.used_gpus for s in shares) == pytest.approx(r.utilization_pct / 100)  # the fleet's use
    return {s.pod: s for s in shares}


def test_an_idle_1g_pod_beside_a_busy_4g_instance_nobody_holds_used_nothing() -> None:
    r = mig_reading(NOW, {1: "0.0", 2: "1.0"})
    assert r.utilization_known and r.utilization_pct == pytest.approx(100 * 4 / 7)
    shares = split(r, held("a"))
    assert shares["a"].allocated_gpus == pytest.approx(1 / 7)
    assert shares["a"].used_gpus == 0.0 and shares["a"].known  # before: 4/7, four times what it held
    assert shares[UNKNOWN].used_gpus == pytest.approx(4 / 7) and shares[UNKNOWN].allocated_gpus == 0.0


def test_each_of_two_mig_pods_uses_what_its_own_instance_used() -> None:
    r = mig_reading(NOW, {1: "0.0", 2: "1.0"})
    shares = split(r, held("a", "b"))
    assert set(shares) == {"a", "b"}
    assert shares["a"].used_gpus == 0.0  # before: 0.8 of its 1/7
    assert shares["b"].used_gpus == pytest.approx(4 / 7) == pytest.approx(shares["b"].allocated_gpus)


def test_an_instance_without_its_activity_is_unknown_for_its_holder_alone() -> None:
    r = mig_reading(NOW, {2: "0.5"})
    assert r.utilization_known and r.utilization_pct == pytest.approx(100 * 0.5 * 4 / 7)
    shares = split(r, held("a", "b"))
    assert not shares["a"].known and shares["a"].used_gpus == 0.0
    assert shares["a"].allocated_gpus == pytest.approx(1 / 7)
    assert shares["b"].known and shares["b"].used_gpus == pytest.approx(0.5 * 4 / 7)
    # slicing is told only the known use
    (batch,) = node_batches([AttributedGpu(r, list(shares.values()))])
    assert [p.pod for p in batch.pods] == ["b"]


def test_a_holder_is_credited_at_most_its_allocation() -> None:
    r = mig_reading(NOW, {1: "0.0", 2: "1.0"})
    # a holder of a 1g device that PodResources and the exporter put on the 4g instance
    shares = split(r, [Holder("ns", "b", "main", UUID, None, "1g.10gb", False, "2")])
    assert shares["b"].used_gpus == pytest.approx(1 / 7)
    assert shares[UNKNOWN].used_gpus == pytest.approx(3 / 7)


async def test_without_podresources_the_pods_the_exporter_labels_an_instance_with_hold_it() -> None:
    async def no_endpoints() -> dict[str, str]:
        return {}

    attributor = PodResourcesAttributor(no_endpoints)
    out = await attributor.attribute([mig_reading(NOW, {1: "0.0", 2: "1.0"})])
    assert out.fallback_nodes == ["n0"]
    shares = {s.pod: s for s in out.gpus[0].shares}
    assert shares["a"].allocated_gpus == pytest.approx(1 / 7) and shares["a"].used_gpus == 0.0
    assert shares["b"].allocated_gpus == pytest.approx(4 / 7)
    assert shares["b"].used_gpus == pytest.approx(4 / 7)


def an_hour(holders: Sequence[Holder], active: dict[int, str]) -> dict[str, Any]:
    accountant = Accountant(AccountingPolicy(interval_s=10.0, idle_window_s=600.0))
    pricing = PriceBook((Flavor("a100", "A100-80GB", None, 7.0),)).pricing("A100-80GB", {})
    for i in range(360):  # an hour of rounds every 10 s
        at = NOW + timedelta(seconds=10 * i)
        r = mig_reading(at, active)
        shares = split_reading(r.utilization_pct, r.memory_used_mib, holders, None, r.model, r.mig_instances)
        accountant.add(r.node, r.gpu_uuid, at, shares, {}, pricing, None, r.utilization_known)
    return {row.key.pod: row for row in accountant.rows.values()}


def test_an_idle_mig_pod_beside_a_busy_one_is_found_idle_and_the_busy_one_is_not() -> None:
    rows = an_hour(held("a", "b"), {1: "0.0", 2: "1.0"})
    assert rows["a"].used_gpu_hours == 0.0 and rows["a"].idle_gpu_hours == pytest.approx(1 / 7)
    assert rows["b"].used_gpu_hours == pytest.approx(4 / 7) and rows["b"].idle_gpu_s == 0.0


def test_an_hour_of_an_instance_without_its_activity_counts_its_allocation_but_no_use_or_idle() -> None:
    rows = an_hour(held("a", "b"), {2: "0.5"})
    assert rows["a"].allocated_gpu_hours == pytest.approx(1 / 7) and rows["a"].cost == pytest.approx(1.0)
    assert rows["a"].used_gpu_hours == 0.0 and rows["a"].idle_gpu_s == 0.0  # unknown, not idle
    assert rows["b"].used_gpu_hours == pytest.approx(0.5 * 4 / 7)
