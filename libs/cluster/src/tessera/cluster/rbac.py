"""What each Tessera service asks of the Kubernetes API: the table its RBAC is made from.

Three layers, each checked against the code below it by tests:

- :data:`CLIENT_CALLS`: the official client's methods that Tessera calls, and the API call each makes;
- :data:`PORT_CALLS`: each method of :class:`~tessera.cluster.kube.KubernetesCluster` (the `Cluster`
  port) and the API calls it makes (libs/cluster's tests read the adapter's source to confirm it);
- :data:`SERVICE_CALLS`: per service, every API call it makes (tests/deploy reads each service's
  source for port methods and client calls, and renders the Helm chart's RBAC to compare).

A call's ``scope`` says where it must be allowed: ``cluster`` in every namespace (a ClusterRole),
``namespace`` only in the namespace the service works in (a Role there; the scheduler creates the
pods and PodGroups of admitted jobs in ``TESSERA_SCHEDULER_NAMESPACE`` and nowhere else), ``release``
only in the namespace the service itself runs in (a Role there: the Lease its replicas elect a
leader on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tessera.cluster.conventions.names import POD_GROUP_API_GROUP, POD_GROUP_PLURAL

LEASE_API_GROUP = "coordination.k8s.io"

Scope = Literal["cluster", "namespace", "release"]


@dataclass(frozen=True, order=True)
class ApiCall:
    group: str
    """The API group; ``""`` is the core group."""
    resource: str
    """The plural, with the subresource after a slash (``pods/binding``)."""
    verb: str
    scope: Scope = "cluster"

    def unscoped(self) -> tuple[str, str, str]:
        return (self.group, self.resource, self.verb)


def _calls(group: str, resource: str, *verbs: str, scope: Scope = "cluster") -> frozenset[ApiCall]:
    return frozenset(ApiCall(group, resource, verb, scope) for verb in verbs)


#: the official client's methods (CoreV1Api, CustomObjectsApi) Tessera calls -> the call each makes.
#: A ``list_*`` method called through a watch makes a ``watch`` instead; custom objects are PodGroups,
#: the only custom resource Tessera reads or writes.
CLIENT_CALLS: Mapping[str, ApiCall] = {
    "list_node": ApiCall("", "nodes", "list"),
    "read_node": ApiCall("", "nodes", "get"),
    "patch_node": ApiCall("", "nodes", "patch"),
    "list_namespaced_pod": ApiCall("", "pods", "list"),
    "list_pod_for_all_namespaces": ApiCall("", "pods", "list"),
    "read_namespaced_pod": ApiCall("", "pods", "get"),
    "patch_namespaced_pod": ApiCall("", "pods", "patch"),
    "create_namespaced_pod": ApiCall("", "pods", "create"),
    "create_namespaced_pod_binding": ApiCall("", "pods/binding", "create"),
    "create_namespaced_pod_eviction": ApiCall("", "pods/eviction", "create"),
    "read_namespaced_config_map": ApiCall("", "configmaps", "get"),
    "create_namespaced_config_map": ApiCall("", "configmaps", "create"),
    "replace_namespaced_config_map": ApiCall("", "configmaps", "update"),
    "list_namespaced_custom_object": ApiCall(POD_GROUP_API_GROUP, POD_GROUP_PLURAL, "list"),
    "list_cluster_custom_object": ApiCall(POD_GROUP_API_GROUP, POD_GROUP_PLURAL, "list"),
    "create_namespaced_custom_object": ApiCall(POD_GROUP_API_GROUP, POD_GROUP_PLURAL, "create"),
    "read_namespaced_lease": ApiCall(LEASE_API_GROUP, "leases", "get", "release"),
    "create_namespaced_lease": ApiCall(LEASE_API_GROUP, "leases", "create", "release"),
    "replace_namespaced_lease": ApiCall(LEASE_API_GROUP, "leases", "update", "release"),
}

_NODES_READ = {"list_nodes": _calls("", "nodes", "list"), "watch_nodes": _calls("", "nodes", "watch")}

#: each method of the `Cluster` port's Kubernetes adapter -> the API calls it makes
PORT_CALLS: Mapping[str, frozenset[ApiCall]] = {
    **_NODES_READ,
    "get_node": _calls("", "nodes", "get"),
    "list_pods": _calls("", "pods", "list"),
    "watch_pods": _calls("", "pods", "watch"),
    "get_pod": _calls("", "pods", "get"),
    "list_pod_groups": _calls(POD_GROUP_API_GROUP, POD_GROUP_PLURAL, "list"),
    "watch_pod_groups": _calls(POD_GROUP_API_GROUP, POD_GROUP_PLURAL, "watch"),
    # reads the pod, writes the device assignment annotation, then POSTs the Binding
    "bind": _calls("", "pods", "get", "patch") | _calls("", "pods/binding", "create"),
    "evict": _calls("", "pods/eviction", "create"),
    "patch_node": _calls("", "nodes", "patch"),
    "cordon": _calls("", "nodes", "patch"),
    "get_config_map": _calls("", "configmaps", "get"),
    "apply_config_map": _calls("", "configmaps", "get", "create", "update"),
    "update_config_map": _calls("", "configmaps", "get", "create", "update"),
}

#: what a :class:`~tessera.cluster.cache.ClusterCache` watches: nodes, pods and PodGroups
CACHE_CALLS: frozenset[ApiCall] = frozenset().union(
    *(PORT_CALLS[m] for m in ("list_nodes", "watch_nodes", "list_pods", "watch_pods")),
    PORT_CALLS["list_pod_groups"],
    PORT_CALLS["watch_pod_groups"],
)

#: what a :class:`~tessera.cluster.kube.lease.KubernetesLeaseLock` calls: leader election on a Lease in
#: the service's own namespace (read it, create it, replace the version read)
LEASE_CALLS: frozenset[ApiCall] = frozenset(
    CLIENT_CALLS[m] for m in ("read_namespaced_lease", "create_namespaced_lease", "replace_namespaced_lease")
)

#: per service, every Kubernetes API call it makes. Services with none get a ServiceAccount that
#: can do nothing (slicing will patch nodes and write the device plugin's ConfigMaps once its code
#: does; admission's webhook is still to come).
SERVICE_CALLS: Mapping[str, frozenset[ApiCall]] = {
    # NVML or dcgm-exporter on its own node; the devcluster source reads the devcluster over HTTP
    "telemetry": frozenset(),
    "forecaster": frozenset(),
    "admission": frozenset(),
    "scheduler": (
        CACHE_CALLS  # every node, pod and PodGroup of the cluster
        | PORT_CALLS["get_pod"]
        | PORT_CALLS["bind"]
        | PORT_CALLS["evict"]
        # the pods and PodGroup of an admitted job, in the scheduler's namespace only
        | _calls("", "pods", "create", scope="namespace")
        | _calls(POD_GROUP_API_GROUP, POD_GROUP_PLURAL, "create", scope="namespace")
        # one scheduler decides at a time: the holder of its Lease, in the release's namespace
        | LEASE_CALLS
    ),
    "slicing": frozenset(),
    # watches nodes for impending termination (spot interruptions, scale-down, maintenance)
    "checkpoint": PORT_CALLS["list_nodes"] | PORT_CALLS["watch_nodes"],
}


def policy_rules(calls: Iterable[ApiCall], scope: Scope) -> list[dict[str, Any]]:
    """The calls of one scope as Kubernetes PolicyRules: one rule per group and resource, sorted."""
    verbs: dict[tuple[str, str], set[str]] = {}
    for call in calls:
        if call.scope == scope:
            verbs.setdefault((call.group, call.resource), set()).add(call.verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": sorted(found)}
        for (group, resource), found in sorted(verbs.items())
    ]
