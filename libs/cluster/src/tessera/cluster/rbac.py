"""What each Tessera service asks of the Kubernetes API: the table its RBAC is made from.

Three layers, each checked against the code below it by tests:

- :data:`CLIENT_CALLS`: the official client's methods that Tessera calls, and the API call each makes;
- :data:`PORT_CALLS`: each method of :class:`~tessera.cluster.kube.KubernetesCluster` (the `Cluster`
  port) and the API calls it makes (libs/cluster's tests read the adapter's source to confirm it);
- :data:`SERVICE_CALLS`: per service, every API call it makes (tests/deploy reads each service's
  source for port methods and client calls, and renders the Helm chart's RBAC to compare).

A call's ``scope`` says where it must be allowed: ``cluster`` in every namespace (a ClusterRole),
``namespace`` only in the one namespace the service works in for it (a Role there: admission makes
the Jobs and Service of submitted jobs in ``TESSERA_ADMISSION_NAMESPACE`` and nowhere else; slicing
writes its ConfigMaps in its ``operator_namespace`` and its Events in its ``events_namespace``),
``release`` only in the namespace the service itself runs in (a Role there: the Lease its replicas
elect a leader on).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
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


def _namespaced(calls: Iterable[ApiCall]) -> frozenset[ApiCall]:
    """The same calls, allowed only in the one namespace the service makes them in."""
    return frozenset(replace(call, scope="namespace") for call in calls)


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
    "delete_namespaced_pod": ApiCall("", "pods", "delete"),
    "read_namespaced_pod_status": ApiCall("", "pods/status", "get"),
    "patch_namespaced_pod_status": ApiCall("", "pods/status", "patch"),
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
    "patch_node_status": ApiCall("", "nodes/status", "patch"),
    "read_namespaced_deployment": ApiCall("apps", "deployments", "get"),
    "read_namespaced_stateful_set": ApiCall("apps", "statefulsets", "get"),
    "read_namespaced_replica_set": ApiCall("apps", "replicasets", "get"),
    "read_namespaced_horizontal_pod_autoscaler": ApiCall("autoscaling", "horizontalpodautoscalers", "get"),
    "create_namespaced_horizontal_pod_autoscaler": ApiCall(
        "autoscaling", "horizontalpodautoscalers", "create"
    ),
    "replace_namespaced_horizontal_pod_autoscaler": ApiCall(
        "autoscaling", "horizontalpodautoscalers", "update"
    ),
    "delete_namespaced_horizontal_pod_autoscaler": ApiCall(
        "autoscaling", "horizontalpodautoscalers", "delete"
    ),
    "create_namespaced_event": ApiCall("", "events", "create"),
    # admission: each job's Indexed Jobs and headless Service, made and deleted only in its job
    # namespace; users' labelled Jobs, listed, held and released in any namespace
    "create_namespaced_job": ApiCall("batch", "jobs", "create", "namespace"),
    "delete_namespaced_job": ApiCall("batch", "jobs", "delete", "namespace"),
    "create_namespaced_service": ApiCall("", "services", "create", "namespace"),
    "delete_namespaced_service": ApiCall("", "services", "delete", "namespace"),
    "read_namespaced_job": ApiCall("batch", "jobs", "get"),
    "patch_namespaced_job": ApiCall("batch", "jobs", "patch"),
    "list_job_for_all_namespaces": ApiCall("batch", "jobs", "list"),
    # admission's conditions on a job's Jobs, through the status subresource
    "read_namespaced_job_status": ApiCall("batch", "jobs/status", "get"),
    "patch_namespaced_job_status": ApiCall("batch", "jobs/status", "patch"),
    # a labelled Job's priority: the value of the PriorityClass its pod template names
    "list_priority_class": ApiCall("scheduling.k8s.io", "priorityclasses", "list"),
}

#: custom objects other than PodGroups, per service that calls the generic CustomObjectsApi methods on
#: them: method -> the calls it makes there. The forecaster lists PredictiveAutoscalers and writes their
#: status, and owns KEDA ScaledObjects (tessera.io and keda.sh).
CUSTOM_OBJECT_CALLS: Mapping[str, Mapping[str, frozenset[ApiCall]]] = {
    "forecaster": {
        "list_cluster_custom_object": _calls("tessera.io", "predictiveautoscalers", "list"),
        "patch_namespaced_custom_object_status": _calls(
            "tessera.io", "predictiveautoscalers/status", "patch"
        ),
        "get_namespaced_custom_object": _calls("keda.sh", "scaledobjects", "get"),
        "create_namespaced_custom_object": _calls("keda.sh", "scaledobjects", "create"),
        "replace_namespaced_custom_object": _calls("keda.sh", "scaledobjects", "update"),
        "delete_namespaced_custom_object": _calls("keda.sh", "scaledobjects", "delete"),
    },
    # users' JobSets labelled `tessera.io/queue` in any namespace: listed each round, read for their
    # uid (Events), held and released (patched), deleted when their job is cancelled; users'
    # LeaderWorkerSets: listed for the groups of their gated pods, read for their uid (Events)
    "admission": {
        "list_cluster_custom_object": _calls("jobset.x-k8s.io", "jobsets", "list")
        | _calls("leaderworkerset.x-k8s.io", "leaderworkersets", "list"),
        "get_namespaced_custom_object": _calls("jobset.x-k8s.io", "jobsets", "get")
        | _calls("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
        "patch_namespaced_custom_object": _calls("jobset.x-k8s.io", "jobsets", "patch"),
        "delete_namespaced_custom_object": _calls("jobset.x-k8s.io", "jobsets", "delete"),
        # admission's conditions in a JobSet's status (adapters/kube_jobsets.py)
        "patch_namespaced_custom_object_status": _calls("jobset.x-k8s.io", "jobsets/status", "patch"),
    },
    # each PodGroup's status, kept from its pods (scheduler/entrypoints/podgroup_status.py)
    "scheduler": {
        "patch_namespaced_custom_object_status": _calls(
            POD_GROUP_API_GROUP, f"{POD_GROUP_PLURAL}/status", "patch"
        ),
    },
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
    # one POST of the Binding, the device assignment among its annotations
    "bind": _calls("", "pods/binding", "create"),
    "bind_blocking": _calls("", "pods/binding", "create"),
    "blocking_binds": _calls("", "pods/binding", "create"),  # hands out bind_blocking
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
#: can do nothing.
SERVICE_CALLS: Mapping[str, frozenset[ApiCall]] = {
    # NVML or dcgm-exporter on its own node; the devcluster source reads the devcluster over HTTP. The
    # pods on its node, listed to name the pod and container of each GPU process NVML reports by pid
    "telemetry": frozenset({CLIENT_CALLS["list_pod_for_all_namespaces"]}),
    # the PredictiveAutoscaler controller: its autoscalers, their scale targets, the HPAs and KEDA
    # ScaledObjects it owns, and Events on its autoscalers
    "forecaster": frozenset().union(*CUSTOM_OBJECT_CALLS["forecaster"].values())
    | frozenset(
        CLIENT_CALLS[m]
        for m in (
            "read_namespaced_deployment",
            "read_namespaced_stateful_set",
            "read_namespaced_replica_set",
            "read_namespaced_horizontal_pod_autoscaler",
            "create_namespaced_horizontal_pod_autoscaler",
            "replace_namespaced_horizontal_pod_autoscaler",
            "delete_namespaced_horizontal_pod_autoscaler",
            "create_namespaced_event",
        )
    )
    # one replica forecasts and reconciles at a time: the holder of its Lease, in the release's namespace
    | LEASE_CALLS,
    # each job's Indexed Jobs and headless Service in its job namespace (made suspended, deleted when
    # the job is cancelled); users' Jobs labelled `tessera.io/queue` in any namespace: listed each
    # round, held and released (read, then patched), and an Event on each Job it holds or releases;
    # its conditions in each Job's status; the PriorityClasses, listed for labelled Jobs' priority;
    # the pods labelled with a job id, listed to reconcile jobs with what runs; users' pods labelled
    # `tessera.io/queue` in any namespace: listed, their scheduling gate removed (read, then patched),
    # deleted when preempted, their conditions written through the status subresource
    "admission": frozenset(
        CLIENT_CALLS[m]
        for m in (
            "create_namespaced_job",
            "delete_namespaced_job",
            "create_namespaced_service",
            "delete_namespaced_service",
            "read_namespaced_job",
            "patch_namespaced_job",
            "list_job_for_all_namespaces",
            "list_pod_for_all_namespaces",
            "read_namespaced_pod",
            "patch_namespaced_pod",
            "delete_namespaced_pod",
            "read_namespaced_pod_status",
            "patch_namespaced_pod_status",
            "create_namespaced_event",
            "read_namespaced_job_status",
            "patch_namespaced_job_status",
            "list_priority_class",
        )
    )
    | frozenset().union(*CUSTOM_OBJECT_CALLS["admission"].values()),
    "scheduler": (
        CACHE_CALLS  # every node, pod and PodGroup of the cluster
        | PORT_CALLS["get_pod"]
        | PORT_CALLS["bind"]
        | PORT_CALLS["evict"]
        | frozenset().union(*CUSTOM_OBJECT_CALLS["scheduler"].values())  # PodGroups' status
        # one scheduler decides at a time: the holder of its Lease, in the release's namespace
        | LEASE_CALLS
    ),
    # applies layouts: reads nodes and the pods on them, cordons and labels nodes, evicts checkpointed
    # pods off GPUs being drained, writes the MIG manager's and device plugin's ConfigMaps, and reports
    # a failed change as a node condition and Event
    "slicing": (
        PORT_CALLS["list_nodes"]
        | PORT_CALLS["get_node"]
        | PORT_CALLS["list_pods"]
        | PORT_CALLS["patch_node"]
        | PORT_CALLS["evict"]  # a checkpointed job moved off a GPU being drained
        | frozenset(CLIENT_CALLS[m] for m in ("read_node", "patch_node_status"))
        # the ConfigMaps only in the GPU operator's namespace (settings.operator_namespace), the Events
        # only in settings.events_namespace: a Role in each, never a ClusterRole (one that updates
        # ConfigMaps could rewrite any, kube-system's included)
        | _namespaced(PORT_CALLS["update_config_map"] | {CLIENT_CALLS["create_namespaced_event"]})
        # one replica plans at a time: the holder of its Lease, in the release's namespace
        | LEASE_CALLS
    ),
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
