"""The `Cluster` port: what Tessera's services need from Kubernetes, and nothing else.

Reads are a list (a consistent snapshot with its resourceVersion) plus a watch from that version.
A watch ends when the server closes it (the caller resumes from the last version it saw) and
raises `WatchExpired` when the version is too old to resume from (the caller relists). The
`Reflector` in :mod:`tessera.cluster.reflector` does both for you.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Generic, Protocol, TypeVar

from tessera.cluster.conventions.names import SCHEDULER_NAME
from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import Pod, PodGroup, PodRef

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class ClusterError(Exception):
    """A request the cluster refused; ``code`` is the HTTP status where there is one."""

    code: int = 500


class NotFound(ClusterError):
    code = 404


class Conflict(ClusterError):
    """A write lost a race (stale resourceVersion) or contradicts the current state."""

    code = 409


class AlreadyBound(Conflict):
    """The pod is already assigned to a node."""


class EvictionBlocked(ClusterError):
    """A PodDisruptionBudget does not allow the eviction now (HTTP 429); try again later."""

    code = 429


class WatchExpired(ClusterError):
    """The resourceVersion a watch asked for is too old (HTTP 410 Gone): relist."""

    code = 410


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class WatchEvent(Generic[T_co]):
    type: EventType
    object: T_co
    resource_version: str


@dataclass(frozen=True, slots=True)
class Unparseable:
    """What a watch delivers, as a DELETED event, for an object Tessera cannot read.

    A list leaves such an object out, so a watch reports it gone too, and a cache drops what it
    held under ``key`` ("namespace/name", or "name" for a cluster-wide object): relisting and
    watching agree on what is there. ``error`` says why it did not parse."""

    key: str
    error: str


@dataclass(frozen=True, slots=True)
class Listing(Generic[T_co]):
    items: tuple[T_co, ...]
    resource_version: str


@dataclass(frozen=True, slots=True)
class PodSelector:
    """Which pods to list or watch, as field and label selectors the API server evaluates.

    ``unassigned``: no node yet (``spec.nodeName=``); ``assigned``: on some node (``spec.nodeName!=``);
    ``exclude_terminated``: not Succeeded or Failed (``status.phase!=…``), i.e. still holding resources.
    """

    namespace: str | None = None
    scheduler_name: str | None = None
    unassigned: bool = False
    assigned: bool = False
    node_name: str | None = None
    exclude_terminated: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if sum((self.unassigned, self.assigned, self.node_name is not None)) > 1:
            raise ValueError("pod selector: choose one of unassigned, assigned and node_name")
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))

    @classmethod
    def pending_for(cls, scheduler_name: str = SCHEDULER_NAME, namespace: str | None = None) -> PodSelector:
        """Pods waiting for our scheduler: ``spec.schedulerName=<name>,spec.nodeName=``."""
        return cls(namespace=namespace, scheduler_name=scheduler_name, unassigned=True)

    @classmethod
    def holding_resources(cls, namespace: str | None = None) -> PodSelector:
        """Pods of any scheduler that are on a node and not finished: what node capacity is spent on."""
        return cls(namespace=namespace, assigned=True, exclude_terminated=True)

    def field_selector(self) -> str | None:
        parts = []
        if self.scheduler_name is not None:
            parts.append(f"spec.schedulerName={self.scheduler_name}")
        if self.unassigned:
            parts.append("spec.nodeName=")
        elif self.assigned:
            parts.append("spec.nodeName!=")
        elif self.node_name is not None:
            parts.append(f"spec.nodeName={self.node_name}")
        if self.exclude_terminated:
            parts += ["status.phase!=Succeeded", "status.phase!=Failed"]
        return ",".join(parts) or None

    def label_selector(self) -> str | None:
        return ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())) or None

    def matches(self, pod: Pod) -> bool:
        if self.namespace is not None and pod.namespace != self.namespace:
            return False
        if self.scheduler_name is not None and pod.scheduler_name != self.scheduler_name:
            return False
        if self.unassigned and pod.node_name:
            return False
        if self.assigned and not pod.node_name:
            return False
        if self.node_name is not None and pod.node_name != self.node_name:
            return False
        if self.exclude_terminated and pod.terminated:
            return False
        return all(pod.labels.get(k) == v for k, v in self.labels.items())


@dataclass(frozen=True, slots=True)
class ConfigMap:
    namespace: str
    name: str
    data: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)
    resource_version: str | None = None


ConfigMapMutation = Callable[[Mapping[str, str]], Mapping[str, str] | Awaitable[Mapping[str, str]]]


class Cluster(Protocol):
    """The cluster as Tessera's services see it. Every method is a coroutine or an async iterator."""

    async def list_nodes(self) -> Listing[Node]: ...

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent[Node | Unparseable]]: ...

    async def list_pods(self, selector: PodSelector = PodSelector()) -> Listing[Pod]: ...

    def watch_pods(
        self, resource_version: str, selector: PodSelector = PodSelector()
    ) -> AsyncIterator[WatchEvent[Pod | Unparseable]]: ...

    async def list_pod_groups(self, namespace: str | None = None) -> Listing[PodGroup]: ...

    def watch_pod_groups(
        self, resource_version: str, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent[PodGroup | Unparseable]]: ...

    async def get_pod(self, ref: PodRef) -> Pod:
        """The pod now; NotFound if it does not exist."""
        ...

    async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
        """Assign the pod to a node (Binding subresource), writing the device assignment first.

        Raises AlreadyBound when the pod already has a node, NotFound when it is gone, Conflict when
        the assignment names a uid (``pod_uid``) that is not the pod's (it was made again under the
        same name): the uid is the Binding's precondition.
        """
        ...

    async def evict(self, ref: PodRef, grace_period_seconds: int | None = None) -> None:
        """Evict through the Eviction API (policy/v1). EvictionBlocked when a budget forbids it now."""
        ...

    async def patch_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> Node:
        """Set (or, with None, remove) node labels and annotations."""
        ...

    async def cordon(self, name: str, unschedulable: bool = True) -> Node: ...

    async def get_config_map(self, namespace: str, name: str) -> ConfigMap | None: ...

    async def apply_config_map(
        self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> ConfigMap:
        """Create the ConfigMap, or replace its data; retries when another writer got there first."""
        ...

    async def update_config_map(self, namespace: str, name: str, mutate: ConfigMapMutation) -> ConfigMap:
        """Read-modify-write of the data (created empty if missing); on a 409 it rereads and retries."""
        ...
