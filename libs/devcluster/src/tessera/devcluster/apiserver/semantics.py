"""Per-resource rules the real API server applies on create and update (its 'strategies')."""

from __future__ import annotations

import copy
import re
from typing import Any

from tessera.devcluster.apiserver import admissionregistration, workloads
from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.errors import invalid
from tessera.devcluster.apiserver.resources import (
    CUSTOMRESOURCEDEFINITIONS,
    MUTATINGWEBHOOKCONFIGURATIONS,
    NAMESPACES,
    NODES,
    PODS,
    ResourceType,
)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# Pod spec fields that an update may change; every other spec change is forbidden.
_MUTABLE_POD_SPEC = {
    "activeDeadlineSeconds",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
}


def validate_name(resource: ResourceType, name: str) -> None:
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise invalid(
            resource.kind,
            name,
            "metadata.name",
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            "'-' or '.', and must start and end with an alphanumeric character",
        )


def prepare_for_create(resource: ResourceType, obj: dict[str, Any]) -> None:
    """Defaults and resets, in place, as the resource's create strategy does."""
    if resource == PODS:
        spec = obj.setdefault("spec", {})
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("containers", [])
        default_pod_spec(spec)
        status: dict[str, Any] = {"phase": "Pending"}
        if spec.get("nodeName"):
            status["conditions"] = [pod_scheduled_condition()]
        obj["status"] = status
    elif resource == NAMESPACES:
        obj["status"] = {"phase": "Active"}
        # Every namespace carries its name as a label, which webhooks' namespaceSelectors match.
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif resource == NODES:
        obj.setdefault("spec", {})
        obj.setdefault("status", {})
    elif resource == CUSTOMRESOURCEDEFINITIONS:
        obj["status"] = crd_status(obj)
    elif workloads.is_workload(resource):
        workloads.prepare_for_create(resource, obj)
    elif resource == MUTATINGWEBHOOKCONFIGURATIONS:
        admissionregistration.prepare(obj)
    elif resource.has_status:
        obj.setdefault("status", {})


def crd_status(crd: dict[str, Any]) -> dict[str, Any]:
    """Established at once, with the names asked for, as the apiextensions controller reports it."""
    spec = crd.get("spec") or {}
    now = rfc3339_now()
    return {
        "acceptedNames": copy.deepcopy(spec.get("names") or {}),
        "conditions": [
            {"type": kind, "status": "True", "reason": reason, "lastTransitionTime": now}
            for kind, reason in (("NamesAccepted", "NoConflicts"), ("Established", "InitialNamesAccepted"))
        ],
        "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
    }


def default_pod_spec(spec: dict[str, Any]) -> None:
    """Requests default to limits, and quantities become strings, as the API server's defaulting does."""
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if not isinstance(container, dict):
            continue
        resources = container.get("resources") or {}
        limits = _quantities(resources.get("limits"))
        requests = _quantities(resources.get("requests"))
        if limits:
            container["resources"] = {**resources, "limits": limits, "requests": {**limits, **requests}}
        elif requests:
            container["resources"] = {**resources, "requests": requests}


def _quantities(values: Any) -> dict[str, Any]:
    """Quantities as the server serialises them: strings, even when the client sent numbers."""
    if not isinstance(values, dict):
        return {}
    return {
        k: (f"{v:g}" if isinstance(v, float) else str(v)) if isinstance(v, int | float) else v
        for k, v in values.items()
    }


def _without_images(containers: Any) -> Any:
    if not isinstance(containers, list):
        return containers
    return [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in containers]


def validate_update(resource: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Reject the changes the real server forbids on update of the main resource."""
    if resource == MUTATINGWEBHOOKCONFIGURATIONS:
        admissionregistration.prepare(new)
    if resource != PODS:
        workloads.validate_update(resource, old, new)
        return
    default_pod_spec(new.setdefault("spec", {}))
    name = old["metadata"]["name"]
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    if old_spec.get("nodeName") != new_spec.get("nodeName"):
        raise invalid(
            "Pod", name, "spec.nodeName", "pod updates may not change nodeName; bind the pod instead"
        )

    _check_scheduling_directives(name, old_spec, new_spec)

    def comparable(spec: dict[str, Any]) -> dict[str, Any]:
        kept = {k: v for k, v in spec.items() if k not in _MUTABLE_POD_SPEC and k != "nodeSelector"}
        for key in ("containers", "initContainers"):
            if key in kept:
                kept[key] = _without_images(kept[key])
        return kept

    if comparable(old_spec) != comparable(new_spec):
        raise invalid(
            "Pod",
            name,
            "spec",
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
            "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions) and `spec.schedulingGates`",
        )


def _check_scheduling_directives(name: str, old_spec: dict[str, Any], new_spec: dict[str, Any]) -> None:
    """As the API server's pod update validation: scheduling gates may only be removed, never added
    after creation; while the pod is still gated, `nodeSelector` may gain keys (not change or lose any),
    and once it is not gated, `nodeSelector` may not change at all."""
    old_gates = [g.get("name") for g in old_spec.get("schedulingGates") or [] if isinstance(g, dict)]
    for gate in new_spec.get("schedulingGates") or []:
        gate_name = gate.get("name") if isinstance(gate, dict) else gate
        if gate_name not in old_gates:
            raise invalid(
                "Pod",
                name,
                "spec.schedulingGates",
                f"Forbidden: only deletion is allowed, but found new scheduling gate '{gate_name}'",
            )
    old_selector = old_spec.get("nodeSelector") or {}
    new_selector = new_spec.get("nodeSelector") or {}
    if old_selector == new_selector:
        return
    if not old_gates:
        raise invalid(
            "Pod",
            name,
            "spec.nodeSelector",
            "Forbidden: pod updates may not change nodeSelector once ungated",
        )
    if any(new_selector.get(key) != value for key, value in old_selector.items()):
        raise invalid(
            "Pod",
            name,
            "spec.nodeSelector",
            "Forbidden: only additions to spec.nodeSelector are allowed (no mutations or deletions)",
        )


def pod_scheduled_condition() -> dict[str, Any]:
    return {"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339_now()}


def merge_subresource(
    resource: ResourceType, old: dict[str, Any], new: dict[str, Any], subresource: str | None
) -> dict[str, Any]:
    """Keep what the written part may not change.

    Writes to the main resource keep the old status; writes to `status` keep everything else.
    """
    if not resource.has_status:
        return new
    if subresource == "status":
        merged = copy.deepcopy(old)
        merged["status"] = new.get("status", {})
        return merged
    merged = dict(new)
    if "status" in old:
        merged["status"] = old["status"]
    else:
        merged.pop("status", None)
    return merged
