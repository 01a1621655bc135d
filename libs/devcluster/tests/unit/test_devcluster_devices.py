"""Device allocation at pod admission."""

from __future__ import annotations

import pytest

from tessera.cluster.builders import PodManifest
from tessera.cluster.cluster_file import NodeSpec
from tessera.cluster.conventions import encode_assignment
from tessera.cluster.domain.allocation import DeviceAssignment, GpuShare
from tessera.cluster.domain.gpu import MigInstance
from tessera.devcluster.sim.devices import AdmissionError, Holding, allocate
from tessera.devcluster.sim.state import SimGpu, SimNode


def gpus(count: int = 4) -> list[SimGpu]:
    return SimNode.from_spec(NodeSpec("n", 1000, 1000, "A100-80GB", count, 81920), 0).gpus


def test_whole_gpus_go_to_free_gpus_only() -> None:
    devices = gpus()
    held = [Holding(devices[0].uuid, 300)]

    holdings = allocate(PodManifest("p").gpus(2).obj(), devices, held)

    assert [h.gpu_uuid for h in holdings] == [devices[1].uuid, devices[2].uuid]
    assert all(h.milli == 1000 for h in holdings)


def test_a_share_goes_to_the_fullest_gpu_that_fits() -> None:
    devices = gpus()
    held = [Holding(devices[0].uuid, 800), Holding(devices[1].uuid, 500)]

    (holding,) = allocate(PodManifest("p").gpu_milli(400).obj(), devices, held)

    assert (holding.gpu_uuid, holding.milli) == (devices[1].uuid, 400)


def test_mig_requests_take_free_instances_of_the_profile() -> None:
    devices = gpus(1)
    devices[0].mig_enabled = True
    devices[0].mig_instances = (MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4))
    held = [Holding(devices[0].uuid, 0, "3g.40gb", 0)]

    (holding,) = allocate(PodManifest("p").mig("3g.40gb").obj(), devices, held)

    assert (holding.mig_profile, holding.mig_start) == ("3g.40gb", 4)
    with pytest.raises(AdmissionError):
        allocate(PodManifest("q").mig("3g.40gb").obj(), devices, [*held, holding])


def test_the_assignment_annotation_names_the_gpus() -> None:
    devices = gpus()
    assignment = DeviceAssignment("n", (GpuShare(devices[3].uuid, 250),))
    pod = (
        PodManifest("p")
        .gpu_milli(250)
        .annotate("tessera.io/gpu-assignment", encode_assignment(assignment))
        .obj()
    )

    assert allocate(pod, devices, []) == [Holding(devices[3].uuid, 250)]


@pytest.mark.parametrize(
    "pod",
    [
        PodManifest("p").gpus(5).obj(),
        PodManifest("p").gpu_milli(1500).obj(),
    ],
)
def test_impossible_requests_fail_admission(pod: dict[str, object]) -> None:
    with pytest.raises(AdmissionError):
        allocate(pod, gpus(), [])


def test_lost_gpus_are_not_allocated() -> None:
    devices = gpus(2)
    devices[0].lost = True

    with pytest.raises(AdmissionError):
        allocate(PodManifest("p").gpus(2).obj(), devices, [])


def test_time_slicing_hands_out_replicas_least_shared_gpu_first() -> None:
    devices = gpus(4)
    held: list[Holding] = []
    for i in range(8):
        held += allocate(PodManifest(f"p{i}").gpus(1).obj(), devices, held, replicas=2)

    per_gpu = [sum(1 for h in held if h.gpu_uuid == g.uuid) for g in devices]
    assert per_gpu == [2, 2, 2, 2]
    assert [h.gpu_uuid for h in held[:4]] == [g.uuid for g in devices]  # spread before sharing
    assert all(h.replica and h.milli == 500 for h in held)
    with pytest.raises(AdmissionError, match="0 free replicas"):
        allocate(PodManifest("p9").gpus(1).obj(), devices, held, replicas=2)
