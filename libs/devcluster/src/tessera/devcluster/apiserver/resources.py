"""The resource types the devcluster API server serves, with their discovery information."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

_ALL_VERBS = frozenset({"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"})


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    verbs: frozenset[str] = field(default=_ALL_VERBS)
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


PODS = ResourceType(
    "",
    "v1",
    "pods",
    "Pod",
    True,
    ("po",),
    frozenset({"status", "binding", "eviction"}),
    categories=("all",),
)
NODES = ResourceType("", "v1", "nodes", "Node", False, ("no",), frozenset({"status"}))
NAMESPACES = ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), frozenset({"status"}))
CONFIGMAPS = ResourceType("", "v1", "configmaps", "ConfigMap", True, ("cm",))
EVENTS = ResourceType("", "v1", "events", "Event", True, ("ev",))
BINDINGS = ResourceType("", "v1", "bindings", "Binding", True, verbs=frozenset({"create"}))
PODGROUPS = ResourceType(
    "scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", True, ("pg", "pgs"), frozenset({"status"})
)
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True)
PODDISRUPTIONBUDGETS = ResourceType(
    "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), frozenset({"status"})
)

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    PODS,
    NODES,
    NAMESPACES,
    CONFIGMAPS,
    EVENTS,
    BINDINGS,
    PODGROUPS,
    LEASES,
    PODDISRUPTIONBUDGETS,
)


class ResourceRegistry:
    """Looks resource types up by group, version and plural."""

    def __init__(self, types: tuple[ResourceType, ...] = DEFAULT_RESOURCES) -> None:
        self._types = {(t.group, t.version, t.plural): t for t in types}

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(self._types.values())

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def add(self, resource_type: ResourceType) -> None:
        self._types[(resource_type.group, resource_type.version, resource_type.plural)] = resource_type
