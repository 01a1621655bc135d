"""Simulated NVML readings: utilisation, memory, power and temperature per GPU.

Readings follow from the pods a GPU holds. Inference pods replay a container's GPU duty cycle from
the Alibaba GenAI serving trace (`pod_gpu_duty_cycle.csv.gz`), each pod on its own container of the
trace chosen by a stable hash of its name; training pods run hot and steady. Injected faults show:
an XID is reported, an overheating GPU reads 96 C, a lost GPU reads nothing.
"""

from __future__ import annotations

import bisect
import csv
import gzip
import math
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tessera.cluster.catalogue import model as catalogue_model
from tessera.devcluster import data
from tessera.devcluster.sim.devices import Holding, mig_device_uuid
from tessera.devcluster.sim.state import SimGpu

SIM_PROFILE_ANNOTATION = "tessera.io/sim-profile"  # training | inference | idle
DUTY_CYCLE_FILE = data.GENAI_DUTY_CYCLE


# Board power (W) by catalogue model; anything else draws 250 W at full load.
TDP_W = {
    "A100-80GB": 400.0,
    "A100-40GB": 400.0,
    "H100-80GB": 700.0,
    "H200-141GB": 700.0,
    "A30": 165.0,
    "A10": 150.0,
    "L4": 72.0,
    "T4": 70.0,
    "P100": 250.0,
    "V100-16GB": 300.0,
    "V100-32GB": 300.0,
}
OVERHEAT_C = 96.0


@dataclass(frozen=True)
class GpuReading:
    node: str
    index: int
    uuid: str
    model: str
    health: str  # healthy | unhealthy | lost
    utilisation_pct: float
    memory_used_mib: int
    memory_total_mib: int
    power_w: float
    temperature_c: float
    xid_errors: tuple[int, ...] = ()
    throttled: bool = False
    pods: tuple[str, ...] = ()
    sampled_at_s: float = 0.0
    #: compute processes: {"pid", "memory_mib", "pod"} (what NVML's running processes say, with the pod)
    processes: tuple[dict[str, Any], ...] = ()
    mig_devices: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["xid_errors"] = list(self.xid_errors)
        body["pods"] = list(self.pods)
        body["processes"] = [dict(p) for p in self.processes]
        body["mig_devices"] = list(self.mig_devices)
        return body


@dataclass(frozen=True)
class PodLoad:
    """One pod's claim on a GPU, with what the readings need to know of the pod."""

    pod: str  # namespace/name
    holding: Holding
    profile: str  # training | inference | idle


class DutyCycleTrace:
    """Per-container GPU duty cycle (percent) over time, loaded once from the GenAI trace."""

    def __init__(self, series: dict[str, tuple[list[float], list[float]]]) -> None:
        if not series:
            raise ValueError("a duty-cycle trace needs at least one container")
        self._names = sorted(series)
        self._series = series

    @classmethod
    def load(cls, path: str | Path | None = None) -> DutyCycleTrace:
        """The trace from `path`, else `genai/pod_gpu_duty_cycle.csv.gz` in the data directory
        (`$TESSERA_DATA_DIR`, else the bundled traces), else a synthetic diurnal curve."""
        source = Path(path) if path else data.trace(DUTY_CYCLE_FILE)
        if not source.exists():
            if path:
                raise FileNotFoundError(f"duty-cycle trace {source} does not exist")
            return cls.synthetic()
        raw: dict[str, list[tuple[float, float]]] = defaultdict(list)
        with gzip.open(source, "rt", newline="") as handle:
            for row in csv.DictReader(handle):
                raw[row["container_ip"]].append((float(row["timestamp_anon"]), float(row["value"])))
        series = {}
        for name, points in raw.items():
            points.sort()
            start = points[0][0]
            series[name] = ([t - start for t, _ in points], [v for _, v in points])
        return cls(series)

    @classmethod
    def synthetic(cls) -> DutyCycleTrace:
        times = [i * 60.0 for i in range(24 * 60)]
        values = [max(0.0, 35 + 30 * math.sin(2 * math.pi * t / 86400)) for t in times]
        return cls({"synthetic": (times, values)})

    @property
    def containers(self) -> int:
        return len(self._names)

    def value(self, key: str, at_s: float) -> float:
        """Duty cycle of the container that `key` maps to, at `at_s` seconds into its series (looped)."""
        name = self._names[zlib.crc32(key.encode()) % len(self._names)]
        times, values = self._series[name]
        span = times[-1] + (times[1] - times[0] if len(times) > 1 else 60.0)
        index = bisect.bisect_right(times, at_s % span) - 1
        return values[max(0, index)]


@dataclass
class NvmlModel:
    trace: DutyCycleTrace
    training_utilisation: float = 93.0
    ambient_c: float = 30.0
    _offsets: dict[str, float] = field(default_factory=dict)

    def pod_utilisation(self, load: PodLoad, at_s: float) -> float:
        if load.profile == "idle":
            return 0.0
        if load.profile == "inference":
            return self.trace.value(load.pod, at_s)
        wobble = 4.0 * math.sin(at_s / 37.0 + zlib.crc32(load.pod.encode()) % 100)
        return min(100.0, self.training_utilisation + wobble)

    def read(self, node: str, gpu: SimGpu, loads: Sequence[PodLoad], at_s: float) -> GpuReading:
        total_memory = gpu.memory_mib
        if gpu.lost:
            return GpuReading(
                node,
                gpu.index,
                gpu.uuid,
                gpu.model,
                "lost",
                0.0,
                0,
                total_memory,
                0.0,
                0.0,
                tuple(gpu.xids),
                False,
                (),
                at_s,
            )
        geometry = catalogue_model(gpu.model).mig
        utilisation = 0.0
        memory = 0.0
        processes = []
        for load in loads:
            util = self.pod_utilisation(load, at_s)
            before = memory
            if load.holding.mig_profile is not None and geometry is not None:
                profile = geometry.profile(load.holding.mig_profile)
                utilisation += util * profile.compute_slices / geometry.compute_slices
                memory += profile.memory_mib * (0.8 if util > 0 else 0.05)
            else:
                share = load.holding.milli / 1000
                utilisation += util
                fill = 0.85 if load.profile == "training" else 0.6
                memory += total_memory * share * (fill if util > 0 else 0.05)
            pid = 1000 + zlib.crc32(load.pod.encode()) % 4_000_000
            processes.append({"pid": pid, "memory_mib": int(memory - before), "pod": load.pod})
        utilisation = round(min(100.0, utilisation), 1)
        tdp = TDP_W.get(gpu.model, 250.0)
        power = round(tdp * (0.15 + 0.85 * utilisation / 100), 1)
        temperature = OVERHEAT_C if gpu.overheating else round(self.ambient_c + 45 * utilisation / 100, 1)
        return GpuReading(
            node,
            gpu.index,
            gpu.uuid,
            gpu.model,
            "healthy" if gpu.healthy else "unhealthy",
            utilisation,
            int(min(memory, total_memory)),
            total_memory,
            power,
            temperature,
            tuple(gpu.xids),
            gpu.overheating,
            tuple(sorted(load.pod for load in loads)),
            round(at_s, 3),
            tuple(processes),
            tuple(mig_device_uuid(gpu.uuid, inst.start) for inst in gpu.mig_instances)
            if gpu.mig_enabled
            else (),
        )
