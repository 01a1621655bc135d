"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from tessera.devcluster.apiserver.clock import parse_rfc3339
from tessera.devcluster.apiserver.resources import (
    DEPLOYMENTS,
    JOBS,
    JOBSETS,
    NODES,
    PODGROUPS,
    PODS,
    REPLICASETS,
    ResourceType,
)

Column = tuple[str, str, int]  # name, type, priority (1 = only with -o wide)


def age(created: str | None, now: datetime.datetime | None = None) -> str:
    if not created:
        return "<unknown>"
    now = now or datetime.datetime.now(datetime.UTC)
    seconds = max(0, int((now - parse_rfc3339(created)).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 3 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _pod_row(pod: dict[str, Any]) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = status.get("reason") or status.get("phase") or "Unknown"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"
    gates = spec.get("readinessGates") or []
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        phase,
        restarts,
        age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        f"{len(gates)}/{len(gates)}" if gates else "<none>",
    ]


_POD_COLUMNS: list[Column] = [
    ("Name", "string", 0),
    ("Ready", "string", 0),
    ("Status", "string", 0),
    ("Restarts", "integer", 0),
    ("Age", "string", 0),
    ("IP", "string", 1),
    ("Node", "string", 1),
    ("Nominated Node", "string", 1),
    ("Readiness Gates", "string", 1),
]


def _node_row(node: dict[str, Any]) -> list[Any]:
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    state = "Ready" if conditions.get("Ready") == "True" else "NotReady"
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    roles = sorted(
        key.split("/", 1)[1]
        for key in (meta.get("labels") or {})
        if key.startswith("node-role.kubernetes.io/")
    )
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    info = status.get("nodeInfo") or {}
    return [
        meta["name"],
        state,
        ",".join(roles) or "<none>",
        age(meta.get("creationTimestamp")),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP") or "<none>",
        addresses.get("ExternalIP") or "<none>",
        info.get("osImage") or "<unknown>",
        info.get("kernelVersion") or "<unknown>",
        info.get("containerRuntimeVersion") or "<unknown>",
    ]


_NODE_COLUMNS: list[Column] = [
    ("Name", "string", 0),
    ("Status", "string", 0),
    ("Roles", "string", 0),
    ("Age", "string", 0),
    ("Version", "string", 0),
    ("Internal-IP", "string", 1),
    ("External-IP", "string", 1),
    ("OS-Image", "string", 1),
    ("Kernel-Version", "string", 1),
    ("Container-Runtime", "string", 1),
]


def _podgroup_row(group: dict[str, Any]) -> list[Any]:
    spec, status = group.get("spec") or {}, group.get("status") or {}
    return [
        group["metadata"]["name"],
        status.get("phase") or "Pending",
        spec.get("minMember", 0),
        status.get("running", 0),
        age(group["metadata"].get("creationTimestamp")),
    ]


_PODGROUP_COLUMNS: list[Column] = [
    ("Name", "string", 0),
    ("Phase", "string", 0),
    ("MinMember", "integer", 0),
    ("Running", "integer", 0),
    ("Age", "string", 0),
]


def _conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "") for c in (obj.get("status") or {}).get("conditions") or []}


def _job_row(job: dict[str, Any]) -> list[Any]:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    conditions = _conditions(job)
    state = next(
        (s for s in ("Complete", "Failed", "Suspended") if conditions.get(s) == "True"),
        "Running" if status.get("startTime") else "Pending",
    )
    completions = spec.get("completions")
    duration = "<none>"
    if status.get("startTime"):
        end = parse_rfc3339(status["completionTime"]) if status.get("completionTime") else None
        duration = age(status["startTime"], end)
    return [
        job["metadata"]["name"],
        state,
        f"{status.get('succeeded', 0)}/{completions if completions is not None else 1}",
        duration,
        age(job["metadata"].get("creationTimestamp")),
    ]


_JOB_COLUMNS: list[Column] = [
    ("Name", "string", 0),
    ("Status", "string", 0),
    ("Completions", "string", 0),
    ("Duration", "string", 0),
    ("Age", "string", 0),
]


def _deployment_row(deployment: dict[str, Any]) -> list[Any]:
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    return [
        deployment["metadata"]["name"],
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        age(deployment["metadata"].get("creationTimestamp")),
    ]


_DEPLOYMENT_COLUMNS: list[Column] = [
    ("Name", "string", 0),
    ("Ready", "string", 0),
    ("Up-to-date", "integer", 0),
    ("Available", "integer", 0),
    ("Age", "string", 0),
]


def _replicaset_row(replicaset: dict[str, Any]) -> list[Any]:
    spec, status = replicaset.get("spec") or {}, replicaset.get("status") or {}
    return [
        replicaset["metadata"]["name"],
        spec.get("replicas", 1),
        status.get("replicas", 0),
        status.get("readyReplicas", 0),
        age(replicaset["metadata"].get("creationTimestamp")),
    ]


_REPLICASET_COLUMNS: list[Column] = [
    ("Name", "string", 0),
    ("Desired", "integer", 0),
    ("Current", "integer", 0),
    ("Ready", "integer", 0),
    ("Age", "string", 0),
]


def _jobset_row(jobset: dict[str, Any]) -> list[Any]:
    status = jobset.get("status") or {}
    conditions = _conditions(jobset)
    return [
        jobset["metadata"]["name"],
        status.get("terminalState", ""),
        status.get("restarts", 0),
        conditions.get("Completed", ""),
        bool((jobset.get("spec") or {}).get("suspend")),
        age(jobset["metadata"].get("creationTimestamp")),
    ]


_JOBSET_COLUMNS: list[Column] = [
    ("Name", "string", 0),
    ("TerminalState", "string", 0),
    ("Restarts", "integer", 0),
    ("Completed", "string", 0),
    ("Suspended", "boolean", 0),
    ("Age", "string", 0),
]


def _default_row(obj: dict[str, Any]) -> list[Any]:
    return [obj["metadata"]["name"], age(obj["metadata"].get("creationTimestamp"))]


_DEFAULT_COLUMNS: list[Column] = [("Name", "string", 0), ("Age", "string", 0)]

_PRINTERS: dict[ResourceType, tuple[list[Column], Callable[[dict[str, Any]], list[Any]]]] = {
    PODS: (_POD_COLUMNS, _pod_row),
    NODES: (_NODE_COLUMNS, _node_row),
    PODGROUPS: (_PODGROUP_COLUMNS, _podgroup_row),
    JOBS: (_JOB_COLUMNS, _job_row),
    DEPLOYMENTS: (_DEPLOYMENT_COLUMNS, _deployment_row),
    REPLICASETS: (_REPLICASET_COLUMNS, _replicaset_row),
    JOBSETS: (_JOBSET_COLUMNS, _jobset_row),
}


Printer = tuple[list[Column], Callable[[dict[str, Any]], list[Any]]]


def crd_printer(crd: dict[str, Any], version: str) -> Printer | None:
    """The columns a CustomResourceDefinition's `additionalPrinterColumns` give `version`, as the real
    API server prints them: the name, then each column (a `date` as an age); None where it declares
    none (the default Name and Age then)."""
    spec = crd.get("spec") or {}
    declared: list[dict[str, Any]] = []
    for served in spec.get("versions") or []:
        if served.get("name") == version:
            declared = served.get("additionalPrinterColumns") or []
    if not declared:
        return None
    columns: list[Column] = [("Name", "string", 0)]
    columns += [(c["name"], c.get("type", "string"), int(c.get("priority", 0))) for c in declared]

    def row(obj: dict[str, Any]) -> list[Any]:
        cells: list[Any] = [obj["metadata"]["name"]]
        for column in declared:
            value = _json_path(obj, str(column.get("jsonPath", "")))
            cells.append(age(value) if column.get("type") == "date" and isinstance(value, str) else value)
        return cells

    return columns, row


def _json_path(obj: Any, path: str) -> Any:
    """A simple JSONPath (`.spec.a.b`), as printer columns use; None where a field is missing."""
    for field_name in [p for p in path.strip().lstrip("$").split(".") if p]:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(field_name)
    return obj


def has_printer(resource: ResourceType) -> bool:
    """The resource has columns of its own here (as the real server's built-in printers)."""
    return resource in _PRINTERS


def wants_table(accept: str | None) -> bool:
    return bool(accept) and "as=Table" in (accept or "")


def to_table(
    resource: ResourceType,
    items: list[dict[str, Any]],
    resource_version: str,
    printer: Printer | None = None,
) -> dict[str, Any]:
    columns, row = printer or _PRINTERS.get(resource, (_DEFAULT_COLUMNS, _default_row))
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": name,
                "priority": priority,
            }
            for name, kind, priority in columns
        ],
        "rows": [
            {
                "cells": row(item),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": item.get("metadata", {}),
                },
            }
            for item in items
        ],
    }
