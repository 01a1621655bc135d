"""Which pod and container a host process runs in, from its `/proc/<pid>/cgroup`. Pure.

NVML names the users of a GPU by host process id. The kubelet puts each container's processes in a
cgroup whose path names the pod's UID and the container's id, whatever the cgroup version and driver:

* cgroup v2 (one line, `0::<path>`) or v1 (one line per hierarchy, `<id>:<controllers>:<path>`);
* the **systemd** driver: `/kubepods.slice/kubepods-burstable.slice/`
  `kubepods-burstable-pod<uid, '-' as '_'>.slice/cri-containerd-<id>.scope` (also `crio-<id>.scope`,
  `docker-<id>.scope`, `cri-dockerd-<id>.scope`);
* the **cgroupfs** driver: `/kubepods/burstable/pod<uid>/<id>` (Guaranteed pods sit directly under
  `/kubepods`).

A process outside Kubernetes (a system service, a user's shell) names no pod: `parse_cgroup` gives
None. The pod's UID and the container's id then find the pod and container through the API server
(`owner_of`, with the node's pods as `PodIdentity`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

_UUID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
#: the pod's own cgroup: `pod<uid>` (cgroupfs) or `[<prefix>-]kubepods[-<qos>]-pod<uid>.slice` (systemd;
#: a nested kubelet's slices carry a prefix, e.g. `kubelet-kubepods-burstable-pod<uid>.slice`)
_POD = re.compile(rf"^(?:[a-z0-9]+-)*pod(?P<uid>{_UUID})(?:\.slice)?$")
#: a container's cgroup under its pod's: `<id>` (cgroupfs) or `<runtime>-<id>.scope` (systemd)
_CONTAINER = re.compile(
    r"^(?:(?:cri-containerd|crio|docker|cri-dockerd)-)?(?P<id>[0-9a-f]{12,64})(?:\.scope)?$"
)


@dataclass(frozen=True, slots=True)
class CgroupRef:
    """The pod (by UID, lower case with dashes) and the container (by runtime id; "" when the process
    sits in the pod's own cgroup, as a pause or conmon process may) a process runs in."""

    pod_uid: str
    container_id: str = ""


def parse_cgroup_path(path: str) -> CgroupRef | None:
    """The pod and container a cgroup path names; None for a path outside `kubepods`."""
    parts = [p for p in path.split("/") if p]
    if not any("kubepods" in p for p in parts):
        return None
    for i, part in enumerate(parts):
        pod = _POD.match(part)
        if pod is None:
            continue
        uid = pod.group("uid").replace("_", "-").lower()
        container = _CONTAINER.match(parts[i + 1]) if i + 1 < len(parts) else None
        return CgroupRef(uid, container.group("id") if container else "")
    return None


def parse_cgroup(text: str) -> CgroupRef | None:
    """The pod and container of a process from the text of its `/proc/<pid>/cgroup` (v1 or v2): the
    first line whose path names a container, else one naming only a pod, else None (not a pod's).

    A line that is not `<hierarchy id>:<controllers>:<path>` raises ValueError naming the line."""
    found: CgroupRef | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[0].isdigit() or not fields[2].startswith("/"):
            raise ValueError(
                f"cgroup line {number}: expected '<hierarchy id>:<controllers>:/<path>', got {line[:120]!r}"
            )
        ref = parse_cgroup_path(fields[2])
        if ref is None:
            continue
        if ref.container_id:
            return ref
        found = found or ref
    return found


def container_id(status_id: str) -> str:
    """The runtime's id from a container status's `containerID` (`containerd://<id>`, `cri-o://<id>`,
    `docker://<id>`); "" when the status has none yet."""
    return status_id.partition("://")[2] if "://" in status_id else status_id


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod on this node as the API server tells it: its UID, name and containers."""

    uid: str
    namespace: str
    name: str
    #: runtime container id -> container name (running and terminated containers, init and sidecars)
    containers: Mapping[str, str] = field(default_factory=dict)
    #: the names of the pod's containers (`spec.containers`) and init containers
    container_names: Sequence[str] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """The pod (`namespace/name`) and container (None when not told) a process runs in."""

    pod: str
    container: str | None


def owner_of(ref: CgroupRef | None, pods_by_uid: Mapping[str, PodIdentity]) -> ProcessOwner | None:
    """The pod and container a process runs in; None when its cgroup names no pod on this node. A
    container id the pod's statuses do not (yet) list is named only when the pod has one container."""
    if ref is None:
        return None
    pod = pods_by_uid.get(ref.pod_uid)
    if pod is None:
        return None
    name = pod.containers.get(ref.container_id) if ref.container_id else None
    if name is None and ref.container_id and len(pod.container_names) == 1:
        name = pod.container_names[0]
    return ProcessOwner(pod.key, name)


def listing_needed(refs: Iterable[CgroupRef | None], pods_by_uid: Mapping[str, PodIdentity]) -> bool:
    """Whether the pods known so far leave a process unnamed: a pod UID not among them, or a
    container id its pod's statuses did not list (a restarted container). Otherwise the last listing
    still names every process, and the API server is not asked again."""
    for ref in refs:
        if ref is None:
            continue
        pod = pods_by_uid.get(ref.pod_uid)
        if pod is None or (ref.container_id and ref.container_id not in pod.containers):
            return True
    return False
