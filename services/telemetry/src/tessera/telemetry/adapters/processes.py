"""Host process ids to pods: each process's `/proc/<pid>/cgroup`, and the pods on this node.

NVML names the users of a GPU by host process id. Telemetry runs as a DaemonSet; with the host's PID
namespace (the chart's `hostPID`) or the host's `/proc` mounted (`usage.proc_root`), it reads each
process's cgroup (`domain.cgroups`) and finds the pod by UID and the container by id among the pods
the API server places on this node (the official client, `pods` `list` with `spec.nodeName`). The
pods are listed at most once per round, and only when the last listing leaves a process unnamed (a
new pod, a restarted container), so a steady node asks the API server nothing. A process whose pod is
unknown (outside Kubernetes, gone, unreadable, or the API server not answering) is counted in
`unknown` and stays `pid/<n>`.

NVML's pids are the host's. Without the host's PID namespace, `/proc` is the container's own, where
the same numbers name other processes: the resolver checks once that pid 1 of its proc root runs in
no pod (the host's init does not; a container's does) and otherwise resolves nothing, saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tessera.telemetry.domain.cgroups import (
    CgroupRef,
    PodIdentity,
    ProcessOwner,
    container_id,
    listing_needed,
    owner_of,
    parse_cgroup,
)

log = logging.getLogger(__name__)

PodLister = Callable[[], Sequence[PodIdentity]]


def pod_identity(pod: Any) -> PodIdentity:
    """A `V1Pod` of the official client as the resolver needs it."""
    status, spec = pod.status, pod.spec
    statuses = [
        *((status.container_statuses or []) if status else []),
        *((status.init_container_statuses or []) if status else []),
        *((status.ephemeral_container_statuses or []) if status else []),
    ]
    containers = {container_id(s.container_id): s.name for s in statuses if s.container_id}
    names = [c.name for c in [*(spec.init_containers or []), *(spec.containers or [])]] if spec else []
    return PodIdentity(pod.metadata.uid, pod.metadata.namespace, pod.metadata.name, containers, names)


class KubeNodePods:
    """The pods the API server places on one node, through the official client (`CoreV1Api`)."""

    def __init__(self, api_client: Any, node_name: str, *, timeout_s: float = 5.0) -> None:
        from kubernetes import client as k8s

        if not node_name:
            raise ValueError("node_name: the pods of which node (TESSERA_TELEMETRY_NODE_NAME)")
        self._core = k8s.CoreV1Api(api_client)
        self.node_name = node_name
        self.timeout_s = timeout_s

    def __call__(self) -> list[PodIdentity]:
        listing = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name}", _request_timeout=self.timeout_s
        )
        return [pod_identity(p) for p in listing.items]


class ProcessResolver:
    """Host pid -> the pod and container it runs in (see the module)."""

    def __init__(self, pods: PodLister, proc_root: Path = Path("/proc")) -> None:
        self._pods = pods
        self.proc_root = proc_root
        #: processes left unknown since the resolver was made
        self.unknown = 0
        #: why no pid can be resolved (not the host's /proc, the pods not listed); None when all is well
        self.problem: str | None = None
        self._host: bool | None = None
        #: the node's pods as last listed, by UID: listed again only when they leave a process unnamed
        self._by_uid: dict[str, PodIdentity] = {}
        #: how many times the node's pods were listed
        self.listings = 0

    def is_host_proc(self) -> bool:
        """Whether the proc root is the host's: its pid 1 is in no pod's cgroup (checked once)."""
        if self._host is None:
            self._host = self.cgroup_of(1) is None
            if not self._host:
                self.problem = (
                    f"{self.proc_root} is a container's, not the host's (its pid 1 runs in a pod): "
                    "give telemetry the host's PID namespace (the chart's hostPID) or mount the host's "
                    "/proc and set usage.proc_root"
                )
                log.warning("GPU processes stay pid/<n>: %s", self.problem)
        return self._host

    def cgroup_of(self, pid: int) -> CgroupRef | None:
        try:
            return parse_cgroup((self.proc_root / str(pid) / "cgroup").read_text())
        except OSError:  # the process ended, or /proc is not the host's
            return None
        except ValueError as exc:
            log.warning("pid %d: %s", pid, exc)
            return None

    def resolve(self, pids: Iterable[int]) -> dict[int, ProcessOwner | None]:
        """Each pid's pod and container; None where unknown (and counted)."""
        wanted = set(pids)
        if not self.is_host_proc():
            self.unknown += len(wanted)
            return dict.fromkeys(wanted)
        refs = {pid: self.cgroup_of(pid) for pid in wanted}
        if listing_needed(refs.values(), self._by_uid):
            self.listings += 1
            try:
                self._by_uid = {p.uid: p for p in self._pods()}
                self.problem = None
            except Exception as exc:  # the API server is down or refuses: named from what was listed
                self.problem = f"pods of this node could not be listed: {type(exc).__name__}: {exc}"
                log.warning("%s", self.problem)
        owners = {pid: owner_of(ref, self._by_uid) for pid, ref in refs.items()}
        self.unknown += sum(1 for owner in owners.values() if owner is None)
        return owners
