"""Builders of Kubernetes object dicts (raw JSON shape) for tests, demos and the devcluster.

pod = PodManifest("train-0").scheduler().group("train").requests(cpu="2", memory="8Gi").gpus(4).obj()
node = gfd_node_manifest("gpu-1", "NVIDIA-A100-SXM4-80GB", count=8, memory_mib=81920)
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from typing import Any

from tessera.cluster.catalogue.migparted import mig_parted_layout
from tessera.cluster.catalogue.models import model as catalogue_model
from tessera.cluster.catalogue.topologies import typical_board
from tessera.cluster.conventions.names import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_MILLI_ANNOTATION,
    GPU_PRESENT_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    POD_GROUP_API_VERSION,
    POD_GROUP_KIND,
    POD_GROUP_LABEL,
    SCHEDULER_NAME,
    mig_resource_name,
)
from tessera.cluster.domain.gpu import Gpu, MigInstance, MigMode, MigStrategy
from tessera.cluster.domain.node import MigConfigState, Node, Taint

TEST_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
"""A real image for test pods: what a GPU workload runs (nothing pulls it on the devcluster)."""
INIT_IMAGE = "python:3.12-slim"


class PodManifest:
    def __init__(self, name: str, namespace: str = "default", image: str = TEST_IMAGE) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {}, "annotations": {}},
            "spec": {"containers": [{"name": "main", "image": image, "resources": {}}]},
        }

    def scheduler(self, name: str = SCHEDULER_NAME) -> PodManifest:
        self._obj["spec"]["schedulerName"] = name
        return self

    def requests(self, **resources: str) -> PodManifest:
        self._resources("requests").update(resources)
        return self

    def limits(self, resources: dict[str, str]) -> PodManifest:
        self._resources("limits").update(resources)
        return self

    def gpus(self, count: int) -> PodManifest:
        return self.limits({GPU_RESOURCE: str(count)})

    def gpu_milli(self, milli: int) -> PodManifest:
        return self.annotate(GPU_MILLI_ANNOTATION, str(milli))

    def mig(self, profile: str, count: int = 1) -> PodManifest:
        return self.limits({mig_resource_name(profile): str(count)})

    def annotate(self, key: str, value: str) -> PodManifest:
        self._obj["metadata"]["annotations"][key] = value
        return self

    def label(self, key: str, value: str) -> PodManifest:
        self._obj["metadata"]["labels"][key] = value
        return self

    def group(self, name: str) -> PodManifest:
        return self.label(POD_GROUP_LABEL, name)

    def init_container(self, requests: dict[str, str]) -> PodManifest:
        inits = self._obj["spec"].setdefault("initContainers", [])
        inits.append({"name": f"init-{len(inits)}", "image": INIT_IMAGE, "resources": {"requests": requests}})
        return self

    def tolerate(self, toleration: dict[str, str]) -> PodManifest:
        self._obj["spec"].setdefault("tolerations", []).append(toleration)
        return self

    def node_selector(self, selector: dict[str, str]) -> PodManifest:
        self._obj["spec"]["nodeSelector"] = dict(selector)
        return self

    def on_node(self, node: str) -> PodManifest:
        self._obj["spec"]["nodeName"] = node
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)

    def _resources(self, kind: str) -> dict[str, str]:
        resources: dict[str, dict[str, str]] = self._obj["spec"]["containers"][0]["resources"]
        return resources.setdefault(kind, {})


def pod_group_manifest(name: str, min_member: int, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": POD_GROUP_API_VERSION,
        "kind": POD_GROUP_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member},
    }


def gfd_node_manifest(
    name: str,
    product: str,
    count: int,
    memory_mib: int,
    *,
    labels: dict[str, str] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
) -> dict[str, Any]:
    """A GPU node as the GPU Operator labels it, with none of Tessera's annotations."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                GPU_PRESENT_LABEL: "true",
                GPU_PRODUCT_LABEL: product,
                GPU_COUNT_LABEL: str(count),
                GPU_MEMORY_LABEL: str(memory_mib),
                **(labels or {}),
            },
            "annotations": {},
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(count)},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(count)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_node(
    name: str,
    model_name: str,
    count: int,
    *,
    cpu_milli: int = 64_000,
    memory_mib: int = 512 * 1024,
    mig_config: str | None = None,
    replicas: int = 1,
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    sxm: bool | None = None,
) -> Node:
    """A domain Node with ``count`` GPUs of a catalogue model, wired as its board usually is.

    UUIDs are derived from the node name, so the same call always builds the same GPUs. With a
    ``mig_config`` (a mig-parted name) every GPU is laid out by it and MIG slices are advertised
    per profile, as the device plugin's mixed strategy does; ``replicas`` time-slices whole GPUs.
    """
    if count < 0:
        raise ValueError(f"count: must be >= 0, got {count}")
    entry = catalogue_model(model_name)
    layout = mig_parted_layout(mig_config, entry) if mig_config else None
    gpus = []
    for index in range(count):
        instances: tuple[MigInstance, ...] = ()
        if layout is not None and layout.profiles and entry.mig is not None:
            instances = tuple(
                MigInstance(
                    i.profile, i.start, f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{name}/{index}/{i.start}')}"
                )
                for i in entry.mig.place(layout.profiles)
            )
        gpus.append(
            Gpu(
                index=index,
                uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'{name}/{index}')}",
                model=entry.name,
                memory_mib=entry.memory_mib,
                mig_mode=MigMode.ENABLED if layout is not None and layout.mig_enabled else MigMode.DISABLED,
                mig_instances=instances,
            )
        )
    extended: dict[str, int] = {}
    if layout is not None and layout.profiles:
        for profile in layout.profiles:
            key = mig_resource_name(profile)
            extended[key] = extended.get(key, 0) + count
    elif count:
        extended[GPU_RESOURCE] = count * replicas
    return Node(
        name=name,
        allocatable_cpu_milli=cpu_milli,
        allocatable_memory_mib=memory_mib,
        gpus=tuple(gpus),
        labels=dict(labels or {}),
        taints=taints,
        interconnect=typical_board(entry.name, count, sxm=sxm) if count else None,
        mig_strategy=MigStrategy.MIXED if layout is not None and layout.mig_enabled else MigStrategy.NONE,
        mig_config=mig_config,
        mig_config_state=MigConfigState.SUCCESS if mig_config else None,
        gpu_replicas=replicas,
        extended_allocatable=extended,
    )
