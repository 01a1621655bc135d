"""The kubelet's PodResources gRPC API, served per simulated node.

Each node gets a real `grpc.aio` server on a loopback port speaking `v1.PodResourcesLister` (the
proto telemetry vendors, `tessera.telemetry.adapters.podresources`), answered from the node's
device holdings: which pod holds which GPU, time-sliced share or MIG device. As the NVIDIA device
plugin reports them, a whole GPU is `nvidia.com/gpu` with the GPU's UUID, a share of a GPU is one
replica of it (`nvidia.com/gpu`, `<uuid>::<n>`), and a MIG device is `nvidia.com/mig-<profile>`
with its `MIG-…` UUID (the node's readings list each GPU's MIG devices). Devices go to the pod's
first container that asks for GPUs (else its first container).

`GET /podresources` on the devcluster's API port lists the endpoints: `{"nodes": {node: "host:port"}}`.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from typing import Any

import grpc

from tessera.cluster.conventions import GPU_RESOURCE, MIG_RESOURCE_PREFIX, mig_resource_name
from tessera.devcluster.apiserver.resources import PODS
from tessera.devcluster.sim.context import SimContext
from tessera.devcluster.sim.devices import mig_device_uuid
from tessera.telemetry.adapters.podresources import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)


def _gpu_container(pod: dict[str, Any] | None) -> str:
    if pod is None:
        return "main"
    containers = (pod.get("spec") or {}).get("containers") or []
    for c in containers:
        limits = {
            **((c.get("resources") or {}).get("requests") or {}),
            **((c.get("resources") or {}).get("limits") or {}),
        }
        if any(r == GPU_RESOURCE or r.startswith(MIG_RESOURCE_PREFIX) for r in limits):
            return str(c.get("name", "main"))
    return str(containers[0].get("name", "main")) if containers else "main"


def list_response(ctx: SimContext, node: str) -> api_pb2.ListPodResourcesResponse:
    """What the node's kubelet would answer to `List` now."""
    with ctx.lock:
        held = sorted((key, d.holdings) for key, d in ctx.devices.items() if d.node == node)
    replica_index: dict[str, int] = defaultdict(int)
    pods = []
    for key, holdings in held:
        namespace, name = key.split("/", 1)
        by_resource: dict[str, list[str]] = defaultdict(list)
        for h in holdings:
            if h.mig_profile is not None and h.mig_start is not None:
                by_resource[mig_resource_name(h.mig_profile)].append(mig_device_uuid(h.gpu_uuid, h.mig_start))
            elif h.replica or h.milli < 1000:
                n = replica_index[h.gpu_uuid]
                replica_index[h.gpu_uuid] += 1
                by_resource[GPU_RESOURCE].append(f"{h.gpu_uuid}::{n}")
            else:
                by_resource[GPU_RESOURCE].append(h.gpu_uuid)
        container = _gpu_container(ctx.store.find(PODS, namespace, name))
        devices = [
            api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)
            for resource, ids in sorted(by_resource.items())
        ]
        pods.append(
            api_pb2.PodResources(
                name=name,
                namespace=namespace,
                containers=[api_pb2.ContainerResources(name=container, devices=devices)],
            )
        )
    return api_pb2.ListPodResourcesResponse(pod_resources=pods)


class _Lister(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, ctx: SimContext, node: str) -> None:
        self.ctx = ctx
        self.node = node

    async def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        return list_response(self.ctx, self.node)

    async def Get(self, request: Any, context: Any) -> api_pb2.GetPodResourcesResponse:
        for pod in list_response(self.ctx, self.node).pod_resources:
            if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                return api_pb2.GetPodResourcesResponse(pod_resources=pod)
        await context.abort(
            grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found"
        )
        raise AssertionError("unreachable")  # abort raises

    async def GetAllocatableResources(
        self, request: Any, context: Any
    ) -> api_pb2.AllocatableResourcesResponse:
        gpus = self.ctx.nodes[self.node].gpus
        ids = [g.uuid for g in gpus if not g.mig_enabled]
        devices = [api_pb2.ContainerDevices(resource_name=GPU_RESOURCE, device_ids=ids)] if ids else []
        for g in gpus:
            for inst in g.mig_instances if g.mig_enabled else ():
                devices.append(
                    api_pb2.ContainerDevices(
                        resource_name=mig_resource_name(inst.profile),
                        device_ids=[mig_device_uuid(g.uuid, inst.start)],
                    )
                )
        return api_pb2.AllocatableResourcesResponse(devices=devices)


class PodResourcesServers:
    """One gRPC server per simulated node, on `host` and a free port; `endpoints` maps node -> target."""

    def __init__(self, ctx: SimContext, host: str = "127.0.0.1") -> None:
        self.ctx = ctx
        self.host = host
        self.endpoints: dict[str, str] = {}
        self._servers: dict[str, Any] = {}

    async def start(self) -> None:
        for node in sorted(self.ctx.nodes):
            server = grpc.aio.server()
            api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self.ctx, node), server)  # type: ignore[no-untyped-call]
            port = server.add_insecure_port(f"{self.host}:0")
            await server.start()
            self._servers[node] = server
            self.endpoints[node] = f"{self.host}:{port}"

    async def stop(self) -> None:
        for server in self._servers.values():
            with contextlib.suppress(Exception):
                await server.stop(grace=None)
        self._servers.clear()
        self.endpoints.clear()
