"""A client of the kubelet's PodResources API: which container holds which device on a node.

The kubelet serves `v1.PodResourcesLister` on a unix socket, by default
`/var/lib/kubelet/pod-resources/kubelet.sock` (mounted into the telemetry DaemonSet); the
devcluster serves the same service per simulated node on a loopback port. Targets are gRPC target
strings: `unix:///path/kubelet.sock` or `host:port`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import grpc

from tessera.telemetry.adapters.podresources import api_pb2, api_pb2_grpc
from tessera.telemetry.domain.attribution import DeviceGrant
from tessera.telemetry.domain.model import SourceUnavailable

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# The kubelet caps messages of this API at 16 MiB (podresources.DefaultMaxMsgSize).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def target_of(endpoint: str) -> str:
    """A gRPC target from a socket path, a `unix://` URL or `host:port`."""
    if endpoint.startswith("/"):
        return f"unix://{endpoint}"
    return endpoint


def grants_of(response: api_pb2.ListPodResourcesResponse) -> list[DeviceGrant]:
    return [
        DeviceGrant(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
        for pod in response.pod_resources
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    ]


class PodResourcesClient:
    """`List` on one kubelet's PodResources endpoint, over one channel kept open."""

    def __init__(self, endpoint: str, *, timeout_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self.target = target_of(endpoint)
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: Any = None

    def socket_missing(self) -> bool:
        """A unix socket target whose file does not exist (the kubelet's socket is not mounted)."""
        if not self.target.startswith("unix://"):
            return False
        return not os.path.exists(self.target[len("unix://") :])

    def _stub_now(self) -> Any:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(
                self.target, options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    async def list_raw(self) -> api_pb2.ListPodResourcesResponse:
        if self.socket_missing():
            raise SourceUnavailable(f"PodResources socket {self.target[len('unix://') :]} does not exist")
        try:
            response: api_pb2.ListPodResourcesResponse = await self._stub_now().List(
                api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise SourceUnavailable(
                f"PodResources at {self.target}: {exc.code().name}: {exc.details()}"
            ) from exc
        return response

    async def list(self) -> list[DeviceGrant]:
        """Every device of every container of the node's pods, one grant per device id."""
        return grants_of(await self.list_raw())

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None


async def close_all(clients: Sequence[PodResourcesClient]) -> None:
    for client in clients:
        await client.close()
