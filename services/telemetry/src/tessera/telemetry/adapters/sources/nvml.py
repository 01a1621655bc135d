"""Readings from NVML on this node, through pynvml (the `nvidia-ml-py` package).

pynvml is imported when the source opens, never at import time, so nodes and machines without an
NVIDIA driver can import the service. Opening fails with `SourceUnavailable` saying what is missing.
XID errors arrive as NVML events: the source registers for critical XIDs once and drains the event
set on every read. Who holds a GPU is told by its compute processes
(`nvmlDeviceGetComputeRunningProcesses`, with their GPU memory), each named `namespace/pod` when a
`ProcessResolver` finds its pod (`adapters.processes`), else `pid/<n>`; each process's SM utilisation
comes from NVML's process utilisation samples (`nvmlDeviceGetProcessUtilization`) since the last
read, when the board keeps them (NVML raises NOT_FOUND when there are none, NOT_SUPPORTED on boards
without them: the processes then carry no SM share and a shared GPU is split by memory).
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime
from types import ModuleType
from typing import Any

from tessera.cluster.catalogue import resolve_product
from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.telemetry.adapters.processes import ProcessResolver
from tessera.telemetry.domain.attribution import GpuProcess
from tessera.telemetry.domain.cgroups import ProcessOwner
from tessera.telemetry.domain.model import Reading, SourceUnavailable

_MIB = 1024 * 1024


def load_pynvml() -> ModuleType:
    try:
        import pynvml as module
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise SourceUnavailable("the NVML source needs the nvidia-ml-py package (import pynvml)") from exc
    loaded: ModuleType = module
    return loaded


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSource:
    def __init__(
        self, node_name: str, nvml: ModuleType | None = None, resolver: ProcessResolver | None = None
    ) -> None:
        if not node_name:
            raise ValueError(
                "node_name: the NVML source needs this node's name (TESSERA_TELEMETRY_NODE_NAME)"
            )
        self.node_name = node_name
        self.name = f"nvml:{node_name}"
        self._nvml = nvml
        self._handles: list[Any] = []
        self._events: Any = None
        self._opened = False
        self.resolver = resolver
        #: GPU index -> the newest process utilisation sample read (NVML's microseconds)
        self._last_sample: dict[int, int] = {}

    def _open(self) -> ModuleType:
        if self._opened and self._nvml is not None:
            return self._nvml
        nvml = self._nvml or load_pynvml()
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
                raise SourceUnavailable(
                    "NVML library (libnvidia-ml.so.1) not found: this machine has no NVIDIA driver; "
                    "use the dcgm or devcluster source instead"
                ) from exc
            raise SourceUnavailable(f"NVML could not start: {exc}") from exc
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        try:
            self._events = nvml.nvmlEventSetCreate()
            for handle in self._handles:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
        except nvml.NVMLError:
            self._events = None  # some boards do not report XID events; readings go on without them
        self._opened = True
        return nvml

    def _drain_xids(self, nvml: ModuleType) -> dict[int, list[int]]:
        xids: dict[int, list[int]] = {}
        if self._events is None:
            return xids
        index_of = {id(h): i for i, h in enumerate(self._handles)}
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:
                return xids  # NVML_ERROR_TIMEOUT: no more events
            index = index_of.get(id(data.device))
            if index is None:
                index = nvml.nvmlDeviceGetIndex(data.device)
            xids.setdefault(index, []).append(int(data.eventData))

    def _optional(self, nvml: ModuleType, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except nvml.NVMLError:  # NOT_SUPPORTED on boards without the counter
            return None

    def _sm_by_pid(self, nvml: ModuleType, index: int, handle: Any) -> dict[int, float] | None:
        """Each process's mean SM utilisation over the samples since the last read; None when NVML
        has none (NOT_FOUND) or the board keeps none (NOT_SUPPORTED)."""
        call = getattr(nvml, "nvmlDeviceGetProcessUtilization", None)
        if call is None:
            return None
        samples = self._optional(nvml, call, handle, self._last_sample.get(index, 0))
        if not samples:
            return None
        sums: dict[int, list[float]] = {}
        for sample in samples:
            sums.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        self._last_sample[index] = max(int(sample.timeStamp) for sample in samples)
        return {pid: sum(values) / len(values) for pid, values in sums.items()}

    def _owners(self, pids: set[int]) -> dict[int, ProcessOwner | None]:
        if self.resolver is None or not pids:
            return {}
        return self.resolver.resolve(pids)

    def read_now(self, now: datetime) -> list[Reading]:
        nvml = self._open()
        xids = self._drain_xids(nvml)
        running = [
            self._optional(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
            for handle in self._handles
        ]
        owners = self._owners({int(p.pid) for processes in running for p in processes})
        readings = []
        for index, handle in enumerate(self._handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            limit_mw = self._optional(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            ecc = self._optional(
                nvml,
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            processes = self._processes(running[index], owners, self._sm_by_pid(nvml, index, handle))
            readings.append(
                Reading(
                    node=self.node_name,
                    gpu_index=index,
                    gpu_uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    at=now,
                    utilization_pct=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_used_mib=int(memory.used) // _MIB,
                    power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                    model=self._model(nvml, handle, int(memory.total) // _MIB),
                    memory_total_mib=int(memory.total) // _MIB,
                    power_limit_w=limit_mw / 1000.0 if limit_mw else None,
                    xid_errors=tuple(xids.get(index, ())),
                    ecc_uncorrected=int(ecc or 0),
                    pods=tuple(p.pod or f"pid/{p.pid}" for p in processes),
                    processes=processes,
                )
            )
        return readings

    @staticmethod
    def _processes(
        running: list[Any], owners: dict[int, ProcessOwner | None], sm: dict[int, float] | None
    ) -> tuple[GpuProcess, ...]:
        out = []
        for p in running:
            pid = int(p.pid)
            used = getattr(p, "usedGpuMemory", None)  # None where the driver does not say
            owner = owners.get(pid)
            out.append(
                GpuProcess(
                    pid,
                    int(used) // _MIB if isinstance(used, int) else 0,
                    owner.pod if owner else None,
                    owner.container if owner else None,
                    None if sm is None else sm.get(pid, 0.0),
                )
            )
        return tuple(out)

    @staticmethod
    def _model(nvml: ModuleType, handle: Any, memory_mib: int) -> str:
        product = _text(nvml.nvmlDeviceGetName(handle))
        return resolve_product(product.replace(" ", "-"), memory_mib).name

    def inventory_now(self) -> list[NodeInventory]:
        nvml = self._open()
        gpus = []
        for index, handle in enumerate(self._handles):
            total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            gpus.append(
                GpuInventory(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=self._model(nvml, handle, total),
                    memory_mib=total,
                )
            )
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // _MIB
        return [
            NodeInventory(
                name=self.node_name, cpu_milli=(os.cpu_count() or 1) * 1000, memory_mib=memory, gpus=gpus
            )
        ]

    async def read(self, now: datetime) -> list[Reading]:
        return await asyncio.to_thread(self.read_now, now)

    async def inventory(self) -> list[NodeInventory]:
        return await asyncio.to_thread(self.inventory_now)

    async def close(self) -> None:
        if self._opened and self._nvml is not None:
            if self._events is not None:
                self._optional(self._nvml, self._nvml.nvmlEventSetFree, self._events)
            self._optional(self._nvml, self._nvml.nvmlShutdown)
            self._handles = []
            self._opened = False
