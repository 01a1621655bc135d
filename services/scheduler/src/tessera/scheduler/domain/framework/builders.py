"""Fluent builders for nodes, pods and gangs, for tests and benchmarks.

``make_node("n1").gpus(8, model="A100-80GB").nvlink_pairs((0, 1), (2, 3)).build()``
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from tessera.scheduler.domain.framework.pod import PodSpec, Policy
from tessera.scheduler.domain.gang.spec import GangSpec
from tessera.scheduler.domain.snapshot import RACK_LABEL, GpuInfo, NodeInfo, Topology


class NodeBuilder:
    def __init__(self, name: str) -> None:
        self._name = name
        self._count = 0
        self._model = "A100-80GB"
        self._numa: tuple[int, ...] | None = None
        self._nvlink: list[tuple[int, int]] = []
        self._nvswitch = False
        self._unhealthy: set[int] = set()
        self._labels: dict[str, str] = {}
        self._cpu = 128_000
        self._memory = 1_048_576
        self._mig: dict[str, int] = {}
        self._schedulable = True

    def gpus(self, count: int, model: str = "A100-80GB") -> NodeBuilder:
        self._count, self._model = count, model
        return self

    def nvlink_pairs(self, *pairs: tuple[int, int]) -> NodeBuilder:
        self._nvlink.extend(pairs)
        return self

    def nvswitch(self) -> NodeBuilder:
        self._nvswitch = True
        return self

    def numa(self, *numa_of: int) -> NodeBuilder:
        self._numa = numa_of
        return self

    def unhealthy(self, *indices: int) -> NodeBuilder:
        self._unhealthy.update(indices)
        return self

    def rack(self, rack: str) -> NodeBuilder:
        self._labels[RACK_LABEL] = rack
        return self

    def label(self, key: str, value: str) -> NodeBuilder:
        self._labels[key] = value
        return self

    def cpu(self, milli: int, memory_mib: int | None = None) -> NodeBuilder:
        self._cpu = milli
        if memory_mib is not None:
            self._memory = memory_mib
        return self

    def mig(self, capacity: Mapping[str, int]) -> NodeBuilder:
        self._mig.update(capacity)
        return self

    def cordoned(self) -> NodeBuilder:
        self._schedulable = False
        return self

    def build(self) -> NodeInfo:
        if self._nvswitch:
            topology = Topology.nvswitch(self._count)
        else:
            topology = Topology.build(self._count, numa_of=self._numa, nvlink_pairs=self._nvlink)
        gpus = tuple(GpuInfo(i, self._model, healthy=i not in self._unhealthy) for i in range(self._count))
        return NodeInfo(
            name=self._name,
            gpus=gpus,
            topology=topology,
            cpu_milli=self._cpu,
            memory_mib=self._memory,
            labels=MappingProxyType(dict(self._labels)),
            mig_capacity=MappingProxyType(dict(self._mig)),
            schedulable=self._schedulable,
        )


def make_node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def make_pod(
    name: str,
    gang: str = "g",
    *,
    gpus: int = 1,
    milli: int = 1000,
    models: Iterable[str] = (),
    mig: Mapping[str, int] | None = None,
    node_policy: Policy | None = None,
    gpu_policy: Policy | None = None,
    cpu_milli: int = 0,
) -> PodSpec:
    return PodSpec(
        name=name,
        gang=gang,
        gpu_count=gpus,
        gpu_milli=milli,
        gpu_models=frozenset(models),
        mig=MappingProxyType(dict(mig or {})),
        node_policy=node_policy,
        gpu_policy=gpu_policy,
        cpu_milli=cpu_milli,
    )


def make_gang(
    name: str,
    pods: int,
    *,
    gpus: int = 1,
    min_available: int = 0,
    priority: int = 0,
    submitted_at: float = 0.0,
    timeout_s: float | None = None,
    **pod_kwargs: object,
) -> GangSpec:
    members = tuple(make_pod(f"{name}-{i}", name, gpus=gpus, **pod_kwargs) for i in range(pods))  # type: ignore[arg-type]
    return GangSpec(name, members, min_available, priority, submitted_at, timeout_s)


def with_members(spec: GangSpec, extra: int, *, gpus: int = 1) -> GangSpec:
    """The same gang with ``extra`` more members (as a controller creates them one by one)."""
    start = len(spec.members)
    more = tuple(make_pod(f"{spec.name}-{i}", spec.name, gpus=gpus) for i in range(start, start + extra))
    return replace(spec, members=spec.members + more)
