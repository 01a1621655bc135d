"""A shared GPU split by its processes: by SM share when NVML sampled each process, else by memory,
else by requested share; the NVML source naming each process's pod and container through the
resolver, and the container carried to the `pod_gpu_usage` batch."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tessera.contracts.events import PodGpuShare
from tessera.telemetry.adapters.processes import ProcessResolver
from tessera.telemetry.adapters.sources.nvml import NvmlSource
from tessera.telemetry.domain.attributed import AttributedGpu
from tessera.telemetry.domain.attribution import (
    SPLIT_MEMORY,
    SPLIT_REQUESTED,
    SPLIT_SM,
    GpuProcess,
    Holder,
    split_reading,
)
from tessera.telemetry.domain.cgroups import PodIdentity, ProcessOwner
from tessera.telemetry.domain.model import Reading
from tessera.telemetry.domain.pod_usage import node_batches
from tessera.telemetry.entrypoints.metrics import usage_metrics

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
GPU = "GPU-shared"
A_UID, B_UID = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
A_CID, B_CID = "a" * 64, "b" * 64


def holders() -> list[Holder]:
    return [Holder("ns", "a", "main", GPU, 500), Holder("ns", "b", "main", GPU, 500)]


def test_sm_samples_split_before_memory() -> None:
    processes = [GpuProcess(1, 6000, "ns/a", "main", 10.0), GpuProcess(2, 2000, "ns/b", "main", 30.0)]
    a, b = split_reading(80.0, 8000, holders(), processes)
    assert a.split == b.split == SPLIT_SM
    assert (a.used_gpus, b.used_gpus) == pytest.approx((0.2, 0.6))
    assert (a.memory_mib, b.memory_mib) == (6000, 2000)  # memory is still each pod's own
    assert (a.allocated_gpus, b.allocated_gpus) == (0.5, 0.5)


def test_without_samples_or_with_idle_sms_the_split_is_by_memory() -> None:
    unsampled = [GpuProcess(1, 6000, "ns/a"), GpuProcess(2, 2000, "ns/b", sm_pct=30.0)]
    idle = [GpuProcess(1, 6000, "ns/a", sm_pct=0.0), GpuProcess(2, 2000, "ns/b", sm_pct=0.0)]
    for processes in (unsampled, idle):
        a, b = split_reading(80.0, 8000, holders(), processes)
        assert a.split == b.split == SPLIT_MEMORY
        assert (a.used_gpus, b.used_gpus) == pytest.approx((0.6, 0.2))


def test_a_process_of_no_holder_leaves_the_requested_split() -> None:
    processes = [GpuProcess(1, 6000, "ns/a", sm_pct=50.0), GpuProcess(2, 2000, None, sm_pct=10.0)]
    a, b = split_reading(80.0, 8000, holders(), processes)
    assert a.split == b.split == SPLIT_REQUESTED
    assert a.used_gpus == b.used_gpus == pytest.approx(0.4)


def test_a_pod_holding_the_gpu_in_two_containers_is_split_by_the_processes_containers() -> None:
    two = [
        Holder("ns", "a", "main", GPU, 250),
        Holder("ns", "a", "side", GPU, 250),
        Holder("ns", "b", "main", GPU, 500),
    ]
    named = [
        GpuProcess(1, 1000, "ns/a", "main", 20.0),
        GpuProcess(2, 1000, "ns/a", "side", 20.0),
        GpuProcess(3, 2000, "ns/b", "main", 60.0),
    ]
    main, side, b = split_reading(100.0, 4000, two, named)
    assert main.split == side.split == b.split == SPLIT_SM
    assert (main.used_gpus, side.used_gpus, b.used_gpus) == pytest.approx((0.2, 0.2, 0.6))
    unnamed = [GpuProcess(1, 1000, "ns/a", None, 20.0), GpuProcess(3, 2000, "ns/b", "main", 60.0)]
    assert {s.split for s in split_reading(100.0, 4000, two, unnamed)} == {SPLIT_REQUESTED}


def test_the_batch_names_the_split_and_the_container() -> None:
    reading = Reading("n0", 0, GPU, NOW, 80.0, 8000, 100.0, 50.0, "A100-80GB")
    processes = [GpuProcess(1, 6000, "ns/a", "main", 10.0), GpuProcess(2, 2000, "ns/b", "main", 30.0)]
    two = [*holders(), Holder("ns", "b", "side", GPU, 0)]
    shares = split_reading(80.0, 8000, holders(), processes)
    (batch,) = node_batches([AttributedGpu(reading, shares)])
    a, b = batch.pods
    assert (a.split, a.container, round(a.utilization_pct, 6)) == (SPLIT_SM, "main", 20.0)
    assert (b.split, b.container, round(b.utilization_pct, 6)) == (SPLIT_SM, "main", 60.0)
    shared = split_reading(80.0, 8000, two, None)
    (batch,) = node_batches([AttributedGpu(reading, shared)])
    assert [(u.pod, u.container) for u in batch.pods] == [("a", "main"), ("b", None)]  # b: two containers
    event = PodGpuShare(
        namespace="ns",
        pod="a",
        gpu_uuid=GPU,
        gpu_index=0,
        utilization_pct=20.0,
        allocated_milli=500,
        split="sm",
    )
    assert event.container is None  # an old event without a container still decodes
    assert PodGpuShare.model_validate({**event.model_dump(), "container": "main"}).container == "main"


class FakeNvmlError(Exception):
    pass


def fake_pynvml(samples: list[Any] | None, *, unsupported: bool = False) -> Any:
    """One A100 shared by three processes: two in pods, one outside Kubernetes."""
    asked: list[int] = []

    def utilisation(handle: object, since: int) -> list[Any]:
        asked.append(since)
        if unsupported:
            raise FakeNvmlError("Not Supported")
        if samples is None:
            raise FakeNvmlError("Not Found")  # what NVML says when nothing was sampled since `since`
        return samples

    return SimpleNamespace(
        NVMLError=FakeNvmlError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_TEMPERATURE_GPU=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlEventTypeXidCriticalError=8,
        asked=asked,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "gpu0",
        nvmlEventSetCreate=lambda: "events",
        nvmlEventSetFree=lambda events: None,
        nvmlDeviceRegisterEvents=lambda handle, kinds, events: None,
        nvmlEventSetWait_v2=lambda events, ms: (_ for _ in ()).throw(FakeNvmlError("timeout")),
        nvmlDeviceGetUUID=lambda h: GPU,
        nvmlDeviceGetName=lambda h: b"NVIDIA A100-SXM4-80GB",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=81920 * 2**20, used=9000 * 2**20),
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=90, memory=10),
        nvmlDeviceGetPowerUsage=lambda h: 250_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 400_000,
        nvmlDeviceGetTemperature=lambda h, sensor: 60,
        nvmlDeviceGetTotalEccErrors=lambda h, t, c: 0,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            SimpleNamespace(pid=101, usedGpuMemory=6000 * 2**20),
            SimpleNamespace(pid=202, usedGpuMemory=2000 * 2**20),
            SimpleNamespace(pid=303, usedGpuMemory=None),
        ],
        nvmlDeviceGetProcessUtilization=utilisation,
    )


def resolver(tmp_path: Path) -> ProcessResolver:
    for pid, text in (
        (101, f"0::/kubepods/burstable/pod{A_UID}/{A_CID}\n"),
        (
            202,
            f"0::/kubepods.slice/kubepods-pod{B_UID.replace('-', '_')}.slice/cri-containerd-{B_CID}.scope\n",
        ),
        (303, "0::/system.slice/some-daemon.service\n"),
    ):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text)
    pods = [
        PodIdentity(A_UID, "ns", "a", {A_CID: "main"}, ["main"]),
        PodIdentity(B_UID, "ns", "b", {B_CID: "server"}, ["server"]),
    ]
    return ProcessResolver(lambda: pods, tmp_path)


async def test_nvml_names_each_process_pod_container_and_sm_share(tmp_path: Path) -> None:
    samples = [
        SimpleNamespace(pid=101, timeStamp=1_000, smUtil=40, memUtil=5),
        SimpleNamespace(pid=101, timeStamp=2_000, smUtil=60, memUtil=5),
        SimpleNamespace(pid=202, timeStamp=1_500, smUtil=25, memUtil=5),
    ]
    nvml = fake_pynvml(samples)
    source = NvmlSource("node-1", nvml=nvml, resolver=resolver(tmp_path))
    (reading,) = await source.read(NOW)
    assert reading.pods == ("ns/a", "ns/b", "pid/303")
    assert [(p.pid, p.memory_mib, p.pod, p.container, p.sm_pct) for p in reading.processes or ()] == [
        (101, 6000, "ns/a", "main", 50.0),
        (202, 2000, "ns/b", "server", 25.0),
        (303, 0, None, None, 0.0),
    ]
    assert source.resolver is not None and source.resolver.unknown == 1
    registry = CollectorRegistry()
    usage_metrics(registry).record_processes(source.resolver.unknown)
    assert registry.get_sample_value("tessera_usage_unknown_process_lookups_total") == 1
    await source.read(NOW)
    usage_metrics(registry).record_processes(source.resolver.unknown)  # pid 303 is still unknown
    assert registry.get_sample_value("tessera_usage_unknown_process_lookups_total") == 2
    assert nvml.asked == [0, 2_000]  # the next read asks for samples newer than the last one seen
    await source.close()


@pytest.mark.parametrize("unsupported", [False, True])
async def test_nvml_without_samples_leaves_the_sm_share_unknown(tmp_path: Path, unsupported: bool) -> None:
    source = NvmlSource(
        "node-1", nvml=fake_pynvml(None, unsupported=unsupported), resolver=resolver(tmp_path)
    )
    (reading,) = await source.read(NOW)
    assert [p.sm_pct for p in reading.processes or ()] == [None, None, None]
    held = [Holder("ns", "a", "main", GPU, 500), Holder("ns", "b", "server", GPU, 500)]
    a, b = split_reading(90.0, 9000, held, [p for p in reading.processes or () if p.pod])
    assert a.split == b.split == SPLIT_MEMORY
    assert (a.used_gpus, b.used_gpus) == pytest.approx((0.675, 0.225))
    await source.close()


def test_the_nodes_pods_are_listed_again_only_when_a_process_is_unnamed(tmp_path: Path) -> None:
    listed: list[list[PodIdentity]] = [[PodIdentity(A_UID, "ns", "a", {A_CID: "main"}, ["main", "side"])]]
    resolver = ProcessResolver(lambda: listed[-1], tmp_path)
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "cgroup").write_text(f"0::/kubepods/burstable/pod{A_UID}/{A_CID}\n")
    assert resolver.resolve([101])[101] == ProcessOwner("ns/a", "main")
    assert resolver.resolve([101])[101] == ProcessOwner("ns/a", "main")
    assert resolver.listings == 1, "a steady node asks the API server once"
    # a new pod's process: listed again, and named
    listed.append([*listed[-1], PodIdentity(B_UID, "ns", "b", {B_CID: "server"}, ["server"])])
    (tmp_path / "202").mkdir()
    (tmp_path / "202" / "cgroup").write_text(f"0::/kubepods/burstable/pod{B_UID}/{B_CID}\n")
    owners = resolver.resolve([101, 202])
    assert (owners[202], resolver.listings) == (ProcessOwner("ns/b", "server"), 2)
    # a restarted container (a new id) of a pod with two containers: listed again
    (tmp_path / "101" / "cgroup").write_text(f"0::/kubepods/burstable/pod{A_UID}/{'c' * 64}\n")
    listed.append([PodIdentity(A_UID, "ns", "a", {"c" * 64: "side"}, ["main", "side"]), listed[-1][1]])
    assert resolver.resolve([101])[101] == ProcessOwner("ns/a", "side")
    assert resolver.listings == 3
