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

Each GPU is read on its own. A GPU that fell off the bus (XID 79: NVML answers GPU_IS_LOST) gives a
reading with `lost` set, under the UUID, model and memory last read from it, so its health turns
(`Fault.LOST`); one lost before the source could read its UUID has none to report under and is left
out. Any other NVML error about one GPU leaves that GPU out of the round (logged, at most every 5
minutes per GPU and error) while the others are read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from datetime import datetime
from types import ModuleType
from typing import Any

from tessera.cluster.catalogue import resolve_product
from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.core.observability.ratelimit import RateLimitedLog
from tessera.telemetry.adapters.processes import ProcessResolver
from tessera.telemetry.domain.attribution import GpuProcess
from tessera.telemetry.domain.cgroups import ProcessOwner
from tessera.telemetry.domain.model import Reading, SourceUnavailable

_MIB = 1024 * 1024
#: pynvml.NVML_ERROR_GPU_IS_LOST, for a module that does not name it
_GPU_IS_LOST = 15

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Identity:
    """What a GPU was last read as, for the reading that says it is lost."""

    uuid: str
    model: str
    memory_total_mib: int


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
        #: by GPU index; None where NVML gave no handle when the source opened
        self._handles: list[Any | None] = []
        self._identity: dict[int, _Identity] = {}
        self._errors = RateLimitedLog(log, interval_s=300.0)
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
        self._handles = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except nvml.NVMLError as exc:
                handle = None
                self._unreadable(nvml, index, exc, "has no NVML handle; left out until NVML reopens")
            else:
                with contextlib.suppress(nvml.NVMLError):  # reading it will say what is wrong
                    self._identify(nvml, index, handle)
            self._handles.append(handle)
        try:
            self._events = nvml.nvmlEventSetCreate()
            for handle in self._handles:
                if handle is not None:
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self._events)
        except nvml.NVMLError:
            self._events = None  # some boards do not report XID events; readings go on without them
        self._opened = True
        return nvml

    def _identify(self, nvml: ModuleType, index: int, handle: Any) -> _Identity:
        total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
        identity = _Identity(_text(nvml.nvmlDeviceGetUUID(handle)), self._model(nvml, handle, total), total)
        self._identity[index] = identity
        return identity

    def _uuid_only(self, nvml: ModuleType, handle: Any) -> _Identity | None:
        uuid = self._optional(nvml, nvml.nvmlDeviceGetUUID, handle)
        return _Identity(_text(uuid), "", 0) if uuid else None

    @staticmethod
    def _is_lost(nvml: ModuleType, exc: Exception) -> bool:
        return getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_GPU_IS_LOST", _GPU_IS_LOST)

    def _unreadable(self, nvml: ModuleType, index: int, exc: Exception, what: str) -> None:
        reason = "lost (fell off the bus)" if self._is_lost(nvml, exc) else str(exc) or type(exc).__name__
        self._errors.warning(
            f"{index}:{getattr(exc, 'value', type(exc).__name__)}",
            f"NVML: GPU {index} {what}: {reason}",
            extra={"node": self.node_name, "gpu_index": index, "error": repr(exc)},
        )

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
                try:
                    index = nvml.nvmlDeviceGetIndex(data.device)
                except nvml.NVMLError:
                    continue  # a lost GPU's XID (79): its reading says it is lost
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
            (self._optional(nvml, nvml.nvmlDeviceGetComputeRunningProcesses, handle) or [])
            if handle is not None
            else []
            for handle in self._handles
        ]
        owners = self._owners({int(p.pid) for processes in running for p in processes})
        readings = []
        for index, handle in enumerate(self._handles):
            if handle is None:
                continue
            try:
                reading = self._read_gpu(nvml, now, index, handle, running[index], owners, xids)
            except nvml.NVMLError as exc:
                identity = self._identity.get(index) or self._uuid_only(nvml, handle)
                if not self._is_lost(nvml, exc) or identity is None:
                    self._unreadable(nvml, index, exc, "could not be read; left out of this round")
                    continue
                reading = Reading(
                    node=self.node_name,
                    gpu_index=index,
                    gpu_uuid=identity.uuid,
                    at=now,
                    utilization_pct=0.0,
                    memory_used_mib=0,
                    power_w=0.0,
                    temperature_c=0.0,
                    model=identity.model,
                    memory_total_mib=identity.memory_total_mib,
                    xid_errors=tuple(xids.get(index, ())),
                    lost=True,
                )
            readings.append(reading)
        return readings

    def _read_gpu(
        self,
        nvml: ModuleType,
        now: datetime,
        index: int,
        handle: Any,
        running: list[Any],
        owners: dict[int, ProcessOwner | None],
        xids: dict[int, list[int]],
    ) -> Reading:
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        limit_mw = self._optional(nvml, nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        ecc = self._optional(
            nvml,
            nvml.nvmlDeviceGetTotalEccErrors,
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        processes = self._processes(running, owners, self._sm_by_pid(nvml, index, handle))
        total = int(memory.total) // _MIB
        identity = _Identity(_text(nvml.nvmlDeviceGetUUID(handle)), self._model(nvml, handle, total), total)
        reading = Reading(
            node=self.node_name,
            gpu_index=index,
            gpu_uuid=identity.uuid,
            at=now,
            utilization_pct=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            memory_used_mib=int(memory.used) // _MIB,
            power_w=nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            temperature_c=float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
            model=identity.model,
            memory_total_mib=total,
            power_limit_w=limit_mw / 1000.0 if limit_mw else None,
            xid_errors=tuple(xids.get(index, ())),
            ecc_uncorrected=int(ecc or 0),
            pods=tuple(p.pod or f"pid/{p.pid}" for p in processes),
            processes=processes,
        )
        self._identity[index] = identity
        return reading

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
            if handle is None:
                continue
            try:
                identity = self._identify(nvml, index, handle)
            except nvml.NVMLError as exc:
                known = self._identity.get(index)
                if known is None:
                    self._unreadable(nvml, index, exc, "could not be read; left out of the inventory")
                    continue
                identity = known  # a lost GPU is still on the node, as last read; its health says lost
            gpus.append(
                GpuInventory(
                    index=index,
                    uuid=identity.uuid,
                    model=identity.model,
                    memory_mib=identity.memory_total_mib,
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
            self._identity = {}
            self._opened = False
