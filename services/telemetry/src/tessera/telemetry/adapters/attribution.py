"""Attribution through the kubelet's PodResources API, per node, with a fallback per node.

Each round the attributor asks each node's PodResources endpoint who holds which device, then
splits each reading among the holders (`domain.attribution`). A node whose endpoint cannot be read
(the socket is not mounted, the kubelet does not answer) falls back to what the GPU source itself
says of the holders (pods from the devcluster or dcgm-exporter, `pid/<n>` from NVML), split equally
(the pods dcgm-exporter labels a MIG instance with hold that instance);
the node is named in `fallback_nodes` and the reason in `problems`, which readiness reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from tessera.telemetry.adapters.podresources.client import PodResourcesClient
from tessera.telemetry.domain.attributed import Attributed, AttributedGpu, PlacedMilli
from tessera.telemetry.domain.attribution import (
    DeviceGrant,
    Holder,
    HolderCache,
    holders_from_grants,
    holders_from_instances,
    holders_from_pods,
    split_reading,
)
from tessera.telemetry.domain.model import Reading, SourceUnavailable

Endpoints = Callable[[], Awaitable[dict[str, str]]]


class PodResourcesAttributor:
    """`endpoints()` gives node -> PodResources endpoint (a socket path or host:port); nodes without
    one use the fallback."""

    def __init__(self, endpoints: Endpoints, *, timeout_s: float = 2.0) -> None:
        self._endpoints = endpoints
        self.timeout_s = timeout_s
        self._clients: dict[str, PodResourcesClient] = {}
        self._holders = HolderCache()

    async def _grants(self, nodes: Sequence[str]) -> tuple[dict[str, list[DeviceGrant]], dict[str, str]]:
        problems: dict[str, str] = {}
        try:
            endpoints = await self._endpoints()
        except Exception as exc:
            return {}, {node: f"PodResources endpoints unknown: {exc}" for node in nodes}
        for node, endpoint in endpoints.items():
            client = self._clients.get(node)
            if client is None or client.endpoint != endpoint:
                if client is not None:
                    await client.close()
                self._clients[node] = PodResourcesClient(endpoint, timeout_s=self.timeout_s)
        asked = [n for n in nodes if n in self._clients]
        for node in nodes:
            if node not in self._clients:
                problems[node] = "no PodResources endpoint for the node"
        results = await asyncio.gather(*(self._clients[n].list() for n in asked), return_exceptions=True)
        grants: dict[str, list[DeviceGrant]] = {}
        for node, result in zip(asked, results, strict=True):
            if isinstance(result, SourceUnavailable):
                problems[node] = str(result)
            elif isinstance(result, BaseException):
                problems[node] = f"{type(result).__name__}: {result}"
            else:
                grants[node] = result
        return grants, problems

    async def attribute(
        self,
        readings: Sequence[Reading],
        placed_milli: PlacedMilli | None = None,
        placements: int | None = None,
    ) -> Attributed:
        parents_of: dict[str, dict[str, str]] = {}
        for r in readings:
            parents = parents_of.setdefault(r.node, {})
            for mig in r.mig_devices:
                parents[mig] = r.gpu_uuid
        grants, problems = await self._grants(sorted(parents_of))
        out = Attributed(problems=problems, fallback_nodes=sorted(problems))
        holders: dict[str, list[Holder]] = {}
        self._holders.keep_only(grants)
        for node, node_grants in grants.items():
            if placements is None:
                by_gpu, unresolved = holders_from_grants(node_grants, parents_of[node], placed_milli)
            else:
                by_gpu, unresolved = self._holders.holders(
                    node, node_grants, parents_of[node], placed_milli, placements
                )
            holders.update(by_gpu)
            out.unresolved += len(unresolved)
        for r in readings:
            if r.lost:
                continue
            if r.node in grants:
                held = holders.get(r.gpu_uuid, [])
            elif r.mig_instances:
                held = holders_from_instances(r.gpu_uuid, r.mig_instances)
            else:
                held = holders_from_pods(r.gpu_uuid, r.pods or ())
            shares = split_reading(
                r.utilization_pct, r.memory_used_mib, held, r.processes, r.model, r.mig_instances
            )
            out.gpus.append(AttributedGpu(r, shares))
        return out

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
