"""Tessera's node annotations for the GPU inventory (``tessera.io/gpus``) and wiring (``tessera.io/gpu-topology``).

GPU Feature Discovery labels say how many GPUs of which product a node has, but not their UUIDs,
their health, their MIG instances or how they are wired. Telemetry (from NVML) and the devcluster
write those details as JSON annotations::

    tessera.io/gpus: [{"index": 0, "uuid": "GPU-…", "model": "A100-80GB", "memory_mib": 81920,
                       "health": "healthy", "mig": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-…"}],
                       "mig_enabled": true, "numa": 0}, …]
    tessera.io/gpu-topology: [["X", "NV", …], …]    (the cells of nvidia-smi topo -m)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tessera.cluster.domain.gpu import Gpu, GpuHealth, MigInstance, MigMode
from tessera.cluster.domain.topology import InterconnectMatrix

_GPUS = "tessera.io/gpus"
_TOPOLOGY = "tessera.io/gpu-topology"


def encode_gpus(gpus: Sequence[Gpu]) -> str:
    items: list[dict[str, Any]] = []
    for gpu in gpus:
        item: dict[str, Any] = {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "model": gpu.model,
            "memory_mib": gpu.memory_mib,
            "health": gpu.health.value,
            "mig_enabled": gpu.mig_enabled,
        }
        if gpu.mig_instances:
            item["mig"] = [_instance(i) for i in gpu.mig_instances]
        if gpu.numa_node is not None:
            item["numa"] = gpu.numa_node
        items.append(item)
    return json.dumps(items, separators=(",", ":"))


def _instance(instance: MigInstance) -> dict[str, Any]:
    out: dict[str, Any] = {"profile": instance.profile, "start": instance.start}
    if instance.uuid:
        out["uuid"] = instance.uuid
    return out


def decode_gpus(text: str) -> tuple[Gpu, ...]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{_GPUS}: not JSON ({exc.msg})") from None
    if not isinstance(raw, list):
        raise ValueError(f"{_GPUS}: expected a JSON list")
    gpus = []
    for i, item in enumerate(raw):
        where = f"{_GPUS}[{i}]"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected an object")
        try:
            instances = tuple(
                MigInstance(str(m["profile"]), int(m["start"]), m.get("uuid")) for m in item.get("mig") or ()
            )
            gpus.append(
                Gpu(
                    index=int(item["index"]),
                    uuid=str(item["uuid"]),
                    model=str(item.get("model", "unknown")),
                    memory_mib=int(item.get("memory_mib", 0)),
                    health=GpuHealth(item.get("health", GpuHealth.HEALTHY.value)),
                    mig_mode=MigMode.ENABLED if item.get("mig_enabled") or instances else MigMode.DISABLED,
                    mig_instances=instances,
                    numa_node=int(item["numa"]) if item.get("numa") is not None else None,
                )
            )
        except KeyError as exc:
            raise ValueError(f"{where}.{exc.args[0]}: missing") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tuple(gpus)


def encode_topology(matrix: InterconnectMatrix) -> str:
    return json.dumps([[link.value for link in row] for row in matrix.links], separators=(",", ":"))


def decode_topology(text: str) -> InterconnectMatrix:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{_TOPOLOGY}: not JSON ({exc.msg})") from None
    if not isinstance(raw, list) or not all(isinstance(row, list) for row in raw):
        raise ValueError(f"{_TOPOLOGY}: expected a list of rows")
    try:
        return InterconnectMatrix.from_rows([[str(cell) for cell in row] for row in raw])
    except ValueError as exc:
        raise ValueError(f"{_TOPOLOGY}: {exc}") from None
