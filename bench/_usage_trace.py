"""B7's input: the GenAI duty-cycle trace as step functions, its containers placed on simulated
nodes of 8 A100-80GB GPUs, and what each node's kubelet (PodResources grants) and NVML (readings with
their processes) say at a moment of it. Building these is the sources' work, not timed by B7."""

from __future__ import annotations

import bisect
import csv
import gzip
import itertools
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tessera.telemetry.domain.attribution import DeviceGrant, GpuProcess
from tessera.telemetry.domain.model import Reading

GPU_MEMORY_MIB = 81920
GPUS_PER_NODE = 8


@dataclass
class Series:
    name: str
    times: list[float]
    values: list[float]
    step: float

    @property
    def start(self) -> float:
        return self.times[0]

    @property
    def end(self) -> float:
        return self.times[-1] + self.step

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        return self.values[max(0, i)]

    def integral(self, start: float, end: float) -> float:
        """Percent-seconds of the step function over [start, end)."""
        total = 0.0
        for i, (t, v) in enumerate(zip(self.times, self.values, strict=True)):
            nxt = self.times[i + 1] if i + 1 < len(self.times) else self.end
            lo, hi = max(t, start), min(nxt, end)
            if hi > lo:
                total += v * (hi - lo)
        return total


def load_trace(path: Path) -> list[Series]:
    raw: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with gzip.open(path, "rt", newline="") as handle:
        for row in csv.DictReader(handle):
            raw[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
    out = []
    for name, points in sorted(raw.items()):
        points.sort()
        times = [t for t, _ in points]
        gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
        step = gaps[len(gaps) // 2] if gaps else 60.0
        out.append(Series(name, times, [min(100.0, max(0.0, v)) for _, v in points], step))
    return out


@dataclass
class Pod:
    name: str
    series: Series
    node: str
    gpu_uuid: str
    milli: int
    device_id: str


def place(series: list[Series]) -> list[Pod]:
    """Two thirds whole GPUs, the rest in pairs sharing a GPU; 8 GPUs a node."""
    pods: list[Pod] = []
    shared = series[: len(series) // 3 // 2 * 2]
    whole = series[len(shared) :]
    gpu = 0

    def where(index: int) -> tuple[str, str]:
        return f"node-{index // GPUS_PER_NODE}", f"GPU-{index:08d}-0000-0000-0000-000000000000"

    for s in whole:
        node, uuid = where(gpu)
        pods.append(Pod(f"pod-{s.name[:12]}", s, node, uuid, 1000, uuid))
        gpu += 1
    for i in range(0, len(shared), 2):
        node, uuid = where(gpu)
        for replica, s in enumerate(shared[i : i + 2]):
            pods.append(Pod(f"pod-{s.name[:12]}", s, node, uuid, 500, f"{uuid}::{replica}"))
        gpu += 1
    return pods


def round_input(
    by_node: dict[str, list[Pod]], gpus_of: dict[str, list[str]], t: float, at: datetime
) -> list[tuple[str, list[DeviceGrant], list[Reading]]]:
    """What each node's kubelet and NVML would say at trace time `t` (not timed: the sources' work)."""
    out = []
    for node, node_pods in by_node.items():
        alive = [p for p in node_pods if p.series.start <= t < p.series.end]
        grants = [DeviceGrant("inference", p.name, "server", "nvidia.com/gpu", p.device_id) for p in alive]
        readings = []
        for uuid in gpus_of[node]:
            on = [p for p in alive if p.gpu_uuid == uuid]
            contributions = [p.series.at(t) * p.milli / 1000 for p in on]
            processes = tuple(
                GpuProcess(
                    1000 + i,
                    int(GPU_MEMORY_MIB * p.milli / 1000 * (0.2 + 0.6 * c / 100)),
                    f"inference/{p.name}",
                )
                for i, (p, c) in enumerate(zip(on, contributions, strict=True))
            )
            readings.append(
                Reading(
                    node,
                    0,
                    uuid,
                    at,
                    min(100.0, sum(contributions)),
                    sum(pr.memory_mib for pr in processes),
                    0.0,
                    40.0,
                    "A100-80GB",
                    GPU_MEMORY_MIB,
                    processes=processes,
                )
            )
        out.append((node, grants, readings))
    return out
