"""The resource types the devcluster API server serves, with their discovery information."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

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

# What a Helm chart deploys (Tessera's own, helm/tessera), and the workloads users run. The
# devcluster's controllers (tessera.devcluster.controllers) reconcile Jobs, JobSets, ReplicaSets,
# Deployments, StatefulSets and LeaderWorkerSets; CustomResourceDefinitions also serve their resources.
_STATUS = frozenset({"status"})
_STATUS_SCALE = frozenset({"status", "scale"})
SERVICEACCOUNTS = ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",))
SECRETS = ResourceType("", "v1", "secrets", "Secret", True)
SERVICES = ResourceType("", "v1", "services", "Service", True, ("svc",), _STATUS, categories=("all",))
DEPLOYMENTS = ResourceType(
    "apps", "v1", "deployments", "Deployment", True, ("deploy",), _STATUS_SCALE, categories=("all",)
)
REPLICASETS = ResourceType(
    "apps", "v1", "replicasets", "ReplicaSet", True, ("rs",), _STATUS_SCALE, categories=("all",)
)
DAEMONSETS = ResourceType(
    "apps", "v1", "daemonsets", "DaemonSet", True, ("ds",), _STATUS, categories=("all",)
)
STATEFULSETS = ResourceType(
    "apps", "v1", "statefulsets", "StatefulSet", True, ("sts",), _STATUS_SCALE, categories=("all",)
)
JOBS = ResourceType("batch", "v1", "jobs", "Job", True, (), _STATUS, categories=("all",))
JOBSETS = ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True, (), _STATUS)
LEADERWORKERSETS = ResourceType(
    "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet", True, ("lws",), _STATUS_SCALE
)
MUTATINGWEBHOOKCONFIGURATIONS = ResourceType(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    False,
)
PRIORITYCLASSES = ResourceType("scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", False, ("pc",))
_RBAC = "rbac.authorization.k8s.io"
ROLES = ResourceType(_RBAC, "v1", "roles", "Role", True)
ROLEBINDINGS = ResourceType(_RBAC, "v1", "rolebindings", "RoleBinding", True)
CLUSTERROLES = ResourceType(_RBAC, "v1", "clusterroles", "ClusterRole", False)
CLUSTERROLEBINDINGS = ResourceType(_RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False)
ENDPOINTS = ResourceType("", "v1", "endpoints", "Endpoints", True, ("ep",))
APISERVICES = ResourceType("apiregistration.k8s.io", "v1", "apiservices", "APIService", False, (), _STATUS)
"""an API group another server provides, proxied to it (`aggregation`)"""
CUSTOMRESOURCEDEFINITIONS = ResourceType(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    False,
    ("crd", "crds"),
    _STATUS,
)

DEPLOYMENT_RESOURCES: tuple[ResourceType, ...] = (
    SERVICEACCOUNTS,
    SECRETS,
    SERVICES,
    DEPLOYMENTS,
    REPLICASETS,
    DAEMONSETS,
    STATEFULSETS,
    JOBS,
    JOBSETS,
    LEADERWORKERSETS,
    MUTATINGWEBHOOKCONFIGURATIONS,
    ROLES,
    ROLEBINDINGS,
    CLUSTERROLES,
    CLUSTERROLEBINDINGS,
    CUSTOMRESOURCEDEFINITIONS,
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
    PRIORITYCLASSES,
    ENDPOINTS,
    APISERVICES,
    *DEPLOYMENT_RESOURCES,
)


def crd_resource_types(crd: dict[str, Any]) -> list[ResourceType]:
    """The resource types a CustomResourceDefinition serves: one per served version."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not (group and plural and kind):
        return []
    return [
        ResourceType(
            group,
            str(version["name"]),
            plural,
            kind,
            spec.get("scope", "Namespaced") == "Namespaced",
            tuple(names.get("shortNames") or ()),
            frozenset(version.get("subresources") or {}),
            categories=tuple(names.get("categories") or ()),
        )
        for version in spec.get("versions") or []
        if isinstance(version, dict) and version.get("served", True) and version.get("name")
    ]


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
