"""Readings scraped from dcgm-exporter's `/metrics` (the Prometheus text exposition format).

Each GPU is one label set: `gpu` (index), `UUID`, `device`, `modelName`, `Hostname`, and, with the
exporter's Kubernetes mapping on, `namespace`/`pod`/`container` of the pod holding it. The fields
read are those of dcgm-exporter's default counters:

| metric | reading |
|---|---|
| DCGM_FI_DEV_GPU_UTIL (%) | utilisation |
| DCGM_FI_PROF_GR_ENGINE_ACTIVE (ratio, when exported) | utilisation where DCGM_FI_DEV_GPU_UTIL is not |
| DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE (MiB) | memory used, total = used + free |
| DCGM_FI_DEV_POWER_USAGE (W) | power |
| DCGM_FI_DEV_GPU_TEMP (C) | temperature |
| DCGM_FI_DEV_XID_ERRORS | the last XID error (0: none) |
| DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, DCGM_FI_DEV_ROW_REMAP_FAILURE | uncorrectable memory errors |
| DCGM_FI_DEV_POWER_MGMT_LIMIT (W, when exported) | power limit |

A MIG instance is a label set of its GPU's with `GPU_I_ID` and `GPU_I_PROFILE` (`3g.40gb`): its values
fold into the GPU's reading. DCGM has no DCGM_FI_DEV_GPU_UTIL for MIG instances, but the profiling
field DCGM_FI_PROF_GR_ENGINE_ACTIVE (the part of the time the instance's graphics/compute engine was
active, 0..1, relative to the instance) is exported per instance. The reading keeps each instance
(`Reading.mig_instances`: its GPU_I_ID, profile, activity and the pods the exporter labels it with),
and attribution credits each holder its own instance's activity times the instance's part of the GPU
(compute slices over the GPU's), so one holder of a 1g instance busy all the time used 1/7 of an
A100, what it holds, and an idle neighbour used nothing. The GPU's utilisation (the fleet figure) is
the instances' activity so weighed; an instance without a profile counts as 1/7 of the GPU, as in
attribution, and one without activity counts nothing there and is unknown for its holder.

A value that is not finite (the exporter writes NaN where DCGM has no value, and a broken counter can
read +Inf) counts as missing, like a field not exported: it would otherwise fail the whole scrape and
leave every GPU of the node unread. A missing utilisation (neither field, or only NaN) is unknown,
not 0%: the reading says so (`utilization_known`), so a GPU without one is never taken for an idle one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tessera.cluster.catalogue import resolve_product
from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.telemetry.domain.attribution import MigInstance, mig_fraction
from tessera.telemetry.domain.model import Reading, SourceUnavailable

_ECC_METRICS = (
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"


@dataclass
class _Gpu:
    index: int
    uuid: str
    model: str
    hostname: str
    values: dict[str, float] = field(default_factory=dict)
    pods: set[str] = field(default_factory=set)
    mapped: bool = False  # the exporter reports pod labels for this GPU
    #: GPU_I_ID -> the MIG instance's GPU_I_PROFILE, its pods, and its DCGM_FI_PROF_GR_ENGINE_ACTIVE
    instances: dict[str, _Instance] = field(default_factory=dict)


@dataclass
class _Instance:
    profile: str
    pods: set[str] = field(default_factory=set)
    active: float | None = None


def parse_exposition(text: str) -> dict[str, _Gpu]:
    """GPU label sets and their values, keyed by UUID. MIG instances fold into their parent GPU."""
    gpus: dict[str, _Gpu] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ValueError(f"dcgm-exporter metrics: not the Prometheus text format: {exc}") from exc
    for family in families:
        if not family.name.startswith("DCGM_FI_"):
            continue
        for sample in family.samples:
            # the parser names counter samples `<family>_total`; `_created` and the like are not readings
            if sample.name not in (family.name, f"{family.name}_total"):
                continue
            labels = sample.labels
            uuid = labels.get("UUID")
            if not uuid or "gpu" not in labels:
                continue
            try:
                index = int(labels["gpu"])
            except ValueError:
                raise ValueError(
                    f"dcgm-exporter metrics: {family.name}: gpu={labels['gpu']!r} is not an index"
                ) from None
            gpu = gpus.get(uuid)
            if gpu is None:
                gpu = gpus[uuid] = _Gpu(index, uuid, labels.get("modelName", ""), labels.get("Hostname", ""))
            name = family.name
            instance = labels.get("GPU_I_ID")
            mig = None
            if instance:
                mig = gpu.instances.get(instance)
                if mig is None:
                    mig = gpu.instances[instance] = _Instance(labels.get("GPU_I_PROFILE", ""))
            if not math.isfinite(sample.value):
                pass  # no value: as if the field were not exported (the GPU and its pod still count)
            elif name == _ENGINE_ACTIVE and mig is not None:
                # relative to the instance: weighed by its part of the GPU when the reading is made
                mig.active = sample.value if mig.active is None else max(mig.active, sample.value)
            # MIG instances repeat the parent's UUID: sum what adds up, keep the worst of the rest
            elif name in gpu.values and instance:
                if name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
                    gpu.values[name] += sample.value
                else:
                    gpu.values[name] = max(gpu.values[name], sample.value)
            else:
                gpu.values[name] = sample.value
            if "pod" in labels:
                gpu.mapped = True
                if labels["pod"]:
                    pod = f"{labels.get('namespace', '')}/{labels['pod']}"
                    gpu.pods.add(pod)
                    if mig is not None:
                        mig.pods.add(pod)
    return gpus


def readings_from_exposition(text: str, at: datetime, node: str | None = None) -> list[Reading]:
    readings = []
    for gpu in sorted(parse_exposition(text).values(), key=lambda g: g.index):
        v = gpu.values
        used = int(v.get("DCGM_FI_DEV_FB_USED", 0))
        free = int(v.get("DCGM_FI_DEV_FB_FREE", 0))
        xid = int(v.get("DCGM_FI_DEV_XID_ERRORS", 0))
        limit = v.get("DCGM_FI_DEV_POWER_MGMT_LIMIT")
        model = _model(gpu.model, used + free)
        utilization, instances = _utilization(gpu, model)
        readings.append(
            Reading(
                node=node or gpu.hostname,
                gpu_index=gpu.index,
                gpu_uuid=gpu.uuid,
                at=at,
                utilization_pct=0.0 if utilization is None else utilization,
                utilization_known=utilization is not None,
                memory_used_mib=used,
                power_w=max(0.0, v.get("DCGM_FI_DEV_POWER_USAGE", 0.0)),
                temperature_c=v.get("DCGM_FI_DEV_GPU_TEMP", 0.0),
                model=model,
                memory_total_mib=used + free,
                power_limit_w=limit if limit else None,
                xid_errors=(xid,) if xid else (),
                ecc_uncorrected=int(sum(v.get(m, 0.0) for m in _ECC_METRICS)),
                pods=tuple(sorted(gpu.pods)) if gpu.mapped else None,
                mig_instances=instances,
            )
        )
    return readings


def _utilization(gpu: _Gpu, model: str) -> tuple[float | None, tuple[MigInstance, ...]]:
    """The GPU's utilisation (%): DCGM_FI_DEV_GPU_UTIL, else DCGM_FI_PROF_GR_ENGINE_ACTIVE (of the whole
    GPU, or of its MIG instances weighed by their part of it); None when neither was exported. With
    the instances' activity, the instances too (each credited to its own holder by attribution)."""
    v = gpu.values
    instances: tuple[MigInstance, ...] = ()
    if _GPU_UTIL in v:
        pct = v[_GPU_UTIL]
    elif _ENGINE_ACTIVE in v:
        pct = v[_ENGINE_ACTIVE] * 100.0
    elif any(mig.active is not None for mig in gpu.instances.values()):
        instances = tuple(
            MigInstance(key, mig.profile, mig.active, tuple(sorted(mig.pods)))
            for key, mig in sorted(gpu.instances.items())
        )
        pct = 100.0 * sum(
            max(0.0, min(1.0, mig.active)) * mig_fraction(model, mig.profile)
            for mig in gpu.instances.values()
            if mig.active is not None
        )
    else:
        return None, ()
    return min(100.0, max(0.0, pct)), instances


def _model(model_name: str, memory_mib: int) -> str:
    if not model_name:
        return ""
    return resolve_product(model_name.replace(" ", "-"), memory_mib or None).name


class DcgmExporterSource:
    def __init__(
        self,
        url: str,
        node_name: str | None = None,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = url
        self.node_name = node_name or None
        self.name = f"dcgm:{node_name or url}"
        self._client = client or httpx.AsyncClient(timeout=timeout_s)

    async def scrape(self) -> str:
        try:
            response = await self._client.get(self.url)
        except httpx.HTTPError as exc:
            raise SourceUnavailable(f"dcgm-exporter at {self.url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise SourceUnavailable(f"dcgm-exporter at {self.url}: HTTP {response.status_code}")
        return response.text

    async def read(self, now: datetime) -> list[Reading]:
        return readings_from_exposition(await self.scrape(), now, self.node_name)

    async def inventory(self) -> list[NodeInventory]:
        readings = await self.read(datetime.now().astimezone())
        nodes: dict[str, list[GpuInventory]] = {}
        for r in readings:
            nodes.setdefault(r.node, []).append(
                GpuInventory(index=r.gpu_index, uuid=r.gpu_uuid, model=r.model, memory_mib=r.memory_total_mib)
            )
        # dcgm-exporter says nothing of the node's CPU and memory: those come from the Kubernetes API
        return [
            NodeInventory(name=name, cpu_milli=0, memory_mib=0, gpus=gpus) for name, gpus in nodes.items()
        ]

    async def close(self) -> None:
        await self._client.aclose()
