"""The devcluster's own HTTP endpoints, next to the Kubernetes API on the same port.

    GET    /nvml                 the simulated nodes: {"nodes": [...]}
    GET    /nvml/<node>          NVML readings of the node's GPUs: {"node", "readings": [...]}
    GET    /podresources         each node's kubelet PodResources gRPC endpoint: {"nodes": {node: "host:port"}}
    POST   /faults/<node>        inject a fault: {"kind": "xid"|"overheating"|"lost", "gpu": 0, "code": 79}
                                 (kind "lost" without "gpu" loses the whole node), or a spot interruption:
                                 {"kind": "spot-interruption", "notice_s": 120}: the node is tainted now
                                 and deleted when the notice (simulated seconds) runs out
    DELETE /faults/<node>        clear the node's faults (and withdraw a pending spot interruption)

They are kmock reactions on the emulator, so a telemetry process reads them like any other HTTP.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import kmock

from tessera.devcluster.sim.spot import DEFAULT_NOTICE_S, SpotInterruptionError
from tessera.devcluster.sim.state import FaultKind

if TYPE_CHECKING:
    from tessera.devcluster.runner import DevCluster

_NODE_PATH = r"/{prefix}/(?P<node>[^/]+)"


def _node_of(request: Any, prefix: str) -> str:
    match = re.fullmatch(_NODE_PATH.format(prefix=prefix), request.url.path)
    assert match is not None  # the reaction's own path pattern guarantees it
    return match["node"]


def _error(status: int, reason: str, message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        status=status, reason=reason, message=message, details={"kind": "devcluster"}
    )


def register_http_endpoints(cluster: DevCluster) -> None:
    emulator = cluster.apiserver.emulator

    def known(node: str) -> None:
        if node not in cluster.ctx.nodes:
            raise _error(404, "NotFound", f"node {node!r} is not a devcluster node")

    def list_nodes() -> dict[str, Any]:
        return {"nodes": sorted(cluster.ctx.nodes)}

    def readings(request: Any) -> dict[str, Any]:
        node = _node_of(request, "nvml")
        known(node)
        return {"node": node, "readings": [r.to_json() for r in cluster.nvml_readings(node)]}

    def inject(request: Any) -> dict[str, Any]:
        node = _node_of(request, "faults")
        known(node)
        body = request.data if isinstance(request.data, dict) else None
        if body is None:
            raise _error(
                400, "BadRequest", 'the body must be a JSON object such as {"kind": "xid", "gpu": 0}'
            )
        kind = body.get("kind")
        kinds = [k.value for k in FaultKind]
        if kind not in kinds:
            raise _error(400, "BadRequest", f"kind: expected one of {', '.join(kinds)}; got {kind!r}")
        gpu, code = body.get("gpu"), body.get("code", 79)
        notice_s = body.get("notice_s", DEFAULT_NOTICE_S)
        if gpu is not None and (not isinstance(gpu, int) or isinstance(gpu, bool)):
            raise _error(400, "BadRequest", f"gpu: expected a GPU index, got {gpu!r}")
        if not isinstance(code, int) or isinstance(code, bool):
            raise _error(400, "BadRequest", f"code: expected an XID number, got {code!r}")
        if not isinstance(notice_s, int | float) or isinstance(notice_s, bool) or notice_s < 0:
            raise _error(400, "BadRequest", f"notice_s: expected seconds (0 or more), got {notice_s!r}")
        try:
            notice = cluster.inject_fault(node, gpu, kind, code, notice_s=float(notice_s))
        except SpotInterruptionError as exc:
            raise _error(409, "Conflict", str(exc)) from None
        except ValueError as exc:
            raise _error(400, "BadRequest", str(exc)) from None
        if notice is not None:
            return {"node": node, "injected": notice.to_json()}
        return {"node": node, "injected": {"kind": kind, "gpu": gpu, "code": code if kind == "xid" else None}}

    def clear(request: Any) -> dict[str, Any]:
        node = _node_of(request, "faults")
        known(node)
        try:
            cluster.clear_faults(node)
        except ValueError as exc:
            raise _error(409, "Conflict", str(exc)) from None
        return {"node": node, "cleared": True}

    def podresources() -> dict[str, Any]:
        servers = cluster.podresources
        return {"nodes": dict(servers.endpoints) if servers is not None else {}}

    emulator["get /nvml"] << list_nodes
    emulator["get /podresources"] << podresources
    emulator["get", re.compile(_NODE_PATH.format(prefix="nvml"))] << readings
    emulator["post", re.compile(_NODE_PATH.format(prefix="faults"))] << inject
    emulator["delete", re.compile(_NODE_PATH.format(prefix="faults"))] << clear
