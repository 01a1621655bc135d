"""Conventions: names, the assignment annotation, device-plugin config, and parsing pods and PodGroups."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tessera.cluster.builders import PodManifest, pod_group_manifest
from tessera.cluster.conventions import (
    GPU_ASSIGNMENT_ANNOTATION,
    GPU_MODELS_ANNOTATION,
    decode_assignment,
    encode_assignment,
    mig_count_label,
    mig_profile_of_resource,
    mig_resource_name,
    parse_node,
    parse_pod,
    parse_pod_group,
    quantity,
    time_slicing_config,
    time_slicing_replicas,
)
from tessera.cluster.domain import (
    DeviceAssignment,
    GpuRequest,
    GpuRequestKind,
    GpuShare,
    MigSlice,
    PodPhase,
    Taint,
    TaintEffect,
)


def test_mig_resource_names_round_trip() -> None:
    assert mig_resource_name("1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert mig_resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"
    assert mig_profile_of_resource("nvidia.com/mig-1g.10gb.me") == "1g.10gb+me"
    assert mig_profile_of_resource("nvidia.com/mig-3g.40gb") == "3g.40gb"
    assert mig_profile_of_resource("nvidia.com/gpu") is None
    assert mig_count_label("2g.20gb") == "nvidia.com/mig-2g.20gb.count"


def test_assignment_annotation_round_trips() -> None:
    assignment = DeviceAssignment(
        "node-1",
        (
            GpuShare("GPU-a", 1000),
            GpuShare("GPU-b", 250),
            GpuShare("GPU-c", mig=MigSlice("1g.10gb", 6, "MIG-x")),
        ),
    )
    text = encode_assignment(assignment)
    assert decode_assignment(text) == assignment
    assert '"uuid":"GPU-b","milli":250' in text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not JSON"),
        ('{"v": 2, "node": "n", "gpus": []}', r"\.v: unsupported"),
        ('{"node": "", "gpus": []}', r"\.node"),
        ('{"node": "n", "gpus": [{"milli": 5}]}', r"gpus\[0\]\.uuid"),
        ('{"node": "n", "gpus": [{"uuid": "GPU-a", "milli": 1500}]}', r"gpus\[0\].*1\.\.1000"),
        ('{"node": "n", "gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-a"}]}', "listed twice"),
    ],
)
def test_malformed_assignments_name_the_field(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        decode_assignment(text)


def test_time_slicing_config_round_trips() -> None:
    text = time_slicing_config(4)
    assert "timeSlicing" in text
    assert time_slicing_replicas(text) == {"nvidia.com/gpu": 4}
    assert time_slicing_replicas(time_slicing_config({"nvidia.com/gpu": 2, "nvidia.com/mig-1g.10gb": 3})) == {
        "nvidia.com/gpu": 2,
        "nvidia.com/mig-1g.10gb": 3,
    }
    assert time_slicing_replicas("version: v1\n") == {}


def test_time_slicing_rejects_bad_replicas() -> None:
    with pytest.raises(ValueError, match="replicas: must be >= 1"):
        time_slicing_config(0)
    with pytest.raises(ValueError, match=r"resources\[0\]\.replicas"):
        time_slicing_replicas(
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: x\n"
        )


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (PodManifest("p").requests(cpu="500m", memory="1Gi"), GpuRequest.none()),
        (PodManifest("p").gpus(4), GpuRequest.whole(4)),
        (PodManifest("p").gpu_milli(300), GpuRequest.fraction(300)),
        (PodManifest("p").gpus(1).gpu_milli(1000), GpuRequest.whole(1)),
        (PodManifest("p").mig("3g.40gb", 2), GpuRequest.mig("3g.40gb", 2)),
        (PodManifest("p").mig("1g.10gb+me"), GpuRequest.mig("1g.10gb+me")),
        (
            PodManifest("p").gpu_milli(500).annotate(GPU_MODELS_ANNOTATION, "V100M32|A10"),
            GpuRequest.fraction(500, frozenset({"V100-32GB", "A10"})),
        ),
    ],
)
def test_gpu_requests_are_read_from_resources_and_annotations(
    manifest: PodManifest, expected: GpuRequest
) -> None:
    pod = parse_pod(manifest.obj())
    assert pod.problem is None
    assert pod.requirements.gpu == expected


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (PodManifest("p").gpu_milli(0), "1..1000"),
        (PodManifest("p").gpu_milli(1500), "1..1000"),
        (PodManifest("p").annotate("tessera.io/gpu-milli", "half"), "expected an integer"),
        (PodManifest("p").gpus(2).gpu_milli(500), "one GPU"),
        (PodManifest("p").mig("1g.10gb").mig("3g.40gb"), "one MIG profile"),
        (PodManifest("p").mig("1g.10gb").gpus(1), "cannot be mixed"),
        (PodManifest("p").requests(cpu="lots"), r"containers\[0\]\.resources\[cpu\]"),
        (PodManifest("p").tolerate({"key": "k", "operator": "Maybe"}), r"tolerations\[0\]\.operator"),
    ],
)
def test_bad_requests_leave_the_pod_with_a_problem(manifest: PodManifest, reason: str) -> None:
    pod = parse_pod(manifest.obj())
    assert pod.problem is not None
    assert pod.requirements.gpu.kind is GpuRequestKind.NONE
    assert re.search(reason, pod.problem), pod.problem


def test_cpu_and_memory_add_containers_and_take_the_largest_init_container() -> None:
    obj = (
        PodManifest("p")
        .requests(cpu="1500m", memory="2Gi")
        .init_container({"cpu": "4", "memory": "1Gi"})
        .obj()
    )
    obj["spec"]["containers"].append(
        {"name": "side", "resources": {"limits": {"cpu": "0.5", "memory": "512Mi"}}}
    )
    obj["spec"]["overhead"] = {"cpu": "100m"}
    requirements = parse_pod(obj).requirements
    assert requirements.cpu_milli == 4100
    assert requirements.memory_mib == 2560


def test_pod_identity_state_and_gang_label() -> None:
    assignment = DeviceAssignment("node-1", (GpuShare("GPU-a"),))
    obj = (
        PodManifest("worker-0", "team-a")
        .scheduler()
        .group("train")
        .gpus(1)
        .on_node("node-1")
        .annotate(GPU_ASSIGNMENT_ANNOTATION, encode_assignment(assignment))
        .tolerate({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        .node_selector({"pool": "a100"})
        .obj()
    )
    obj["metadata"]["resourceVersion"] = "17"
    obj["status"] = {"phase": "Running"}
    pod = parse_pod(obj)
    assert (pod.namespace, pod.name, pod.scheduler_name, pod.node_name) == (
        "team-a",
        "worker-0",
        "tessera",
        "node-1",
    )
    assert pod.pod_group == "train"
    assert pod.phase is PodPhase.RUNNING
    assert pod.assignment == assignment
    assert pod.resource_version == "17"
    assert pod.requirements.node_selector == {"pool": "a100"}
    assert pod.requirements.tolerations[0].tolerates(Taint("nvidia.com/gpu", TaintEffect.NO_SCHEDULE))
    assert not pod.requirements.tolerations[0].tolerates(Taint("other", TaintEffect.NO_SCHEDULE))
    assert not pod.gated


def test_a_pod_with_scheduling_gates_is_gated() -> None:
    obj = PodManifest("web-0", "ml").scheduler().obj()
    obj["spec"]["schedulingGates"] = [{"name": "tessera.io/admission"}]
    assert parse_pod(obj).gated
    obj["spec"]["schedulingGates"] = []
    assert not parse_pod(obj).gated


def _snake(obj: Any) -> Any:
    """What a kubernetes V1 object's to_dict() looks like: snake_case keys outside the data maps."""
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            keep = key in ("labels", "annotations", "requests", "limits", "nodeSelector", "overhead")
            new_key = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
            out[new_key] = value if keep else _snake(value)
        return out
    if isinstance(obj, list):
        return [_snake(item) for item in obj]
    return obj


def test_to_dict_spelling_parses_the_same_as_raw_json() -> None:
    obj = PodManifest("p").scheduler().gpus(2).node_selector({"a": "b"}).obj()
    obj["metadata"]["resourceVersion"] = "5"
    assert parse_pod(_snake(obj)) == parse_pod(obj)


def test_pod_group_parses_and_rejects_a_missing_min_member() -> None:
    group = parse_pod_group(pod_group_manifest("train", 4, "team-a"))
    assert (group.namespace, group.name, group.min_member, group.key) == (
        "team-a",
        "train",
        4,
        "team-a/train",
    )
    bad = pod_group_manifest("train", 4)
    del bad["spec"]["minMember"]
    with pytest.raises(ValueError, match="minMember"):
        parse_pod_group(bad)
    with pytest.raises(ValueError, match="minMember: must be >= 1"):
        parse_pod_group(pod_group_manifest("train", 0))


def test_pods_without_names_are_refused() -> None:
    with pytest.raises(ValueError, match=r"metadata\.name"):
        parse_pod({"metadata": {}})


@pytest.mark.parametrize("text", ["Infinity", "NaN", "-inf", "sNaN", "1e999999999", "100Ei", "1e99999999Ki"])
def test_non_finite_and_out_of_range_quantities_are_value_errors(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        quantity.parse_quantity(text)
    with pytest.raises(ValueError):
        quantity.count(text, "labels[nvidia.com/gpu.count]")
    with pytest.raises(ValueError):
        quantity.cpu_milli(text)


def test_a_non_finite_gpu_count_label_is_a_value_error() -> None:
    manifest = {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.count": "Infinity"}}, "status": {}}
    with pytest.raises(ValueError, match="Infinity"):
        parse_node(manifest)
