"""Readings from the devcluster's simulated NVML (`GET /nvml/<node>`), inventory from its nodes.

The devcluster serves the Kubernetes API and its NVML endpoints on one port, so one URL gives both:
the inventory is what the simulated kubelet reports on each Node (parsed with the cluster
conventions, as the scheduler parses it), and the readings are what NVML would say on each node.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import httpx

from tessera.cluster.conventions import parse_node
from tessera.contracts.events import GpuInventory, NodeInventory
from tessera.telemetry.domain.attribution import GpuProcess
from tessera.telemetry.domain.model import Reading, SourceUnavailable


def reading_from_json(body: dict[str, Any], at: datetime) -> Reading:
    """One entry of `GET /nvml/<node>`'s `readings` (see the devcluster's `GpuReading`)."""
    try:
        return Reading(
            node=str(body["node"]),
            gpu_index=int(body["index"]),
            gpu_uuid=str(body["uuid"]),
            at=at,
            utilization_pct=float(body["utilisation_pct"]),
            memory_used_mib=int(body["memory_used_mib"]),
            power_w=float(body["power_w"]),
            temperature_c=float(body["temperature_c"]),
            model=str(body.get("model", "")),
            memory_total_mib=int(body.get("memory_total_mib", 0)),
            xid_errors=tuple(int(x) for x in body.get("xid_errors", ())),
            lost=body.get("health") == "lost",
            pods=tuple(str(p) for p in body.get("pods", ())),
            processes=tuple(
                GpuProcess(int(p["pid"]), int(p["memory_mib"]), p.get("pod")) for p in body["processes"]
            )
            if "processes" in body
            else None,
            mig_devices=tuple(str(m) for m in body.get("mig_devices", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"devcluster reading: bad or missing field {exc}") from exc


def node_inventory(obj: dict[str, Any]) -> NodeInventory:
    node = parse_node(obj)
    return NodeInventory(
        name=node.name,
        cpu_milli=node.allocatable_cpu_milli,
        memory_mib=node.allocatable_memory_mib,
        labels=dict(node.labels),
        gpus=[
            GpuInventory(index=g.index, uuid=g.uuid, model=g.model, memory_mib=g.memory_mib)
            for g in node.gpus
        ],
    )


class DevclusterSource:
    def __init__(self, url: str, *, client: httpx.AsyncClient | None = None, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.name = f"devcluster:{self.url}"
        self._client = client or httpx.AsyncClient(timeout=timeout_s)

    async def _get(self, path: str) -> Any:
        try:
            response = await self._client.get(f"{self.url}{path}")
        except httpx.HTTPError as exc:
            raise SourceUnavailable(f"devcluster at {self.url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise SourceUnavailable(f"devcluster {path}: HTTP {response.status_code}: {response.text[:200]}")
        return response.json()

    async def inventory(self) -> list[NodeInventory]:
        body = await self._get("/api/v1/nodes")
        return [node_inventory(item) for item in body.get("items", [])]

    async def read(self, now: datetime) -> list[Reading]:
        nodes = (await self._get("/nvml"))["nodes"]
        bodies = await asyncio.gather(*(self._get(f"/nvml/{node}") for node in nodes))
        return [reading_from_json(r, now) for body in bodies for r in body["readings"]]

    async def podresources_endpoints(self) -> dict[str, str]:
        """Each simulated node's kubelet PodResources endpoint (`host:port`)."""
        body = await self._get("/podresources")
        return {str(node): str(target) for node, target in body.get("nodes", {}).items()}

    async def close(self) -> None:
        await self._client.aclose()
