"""The `scale` subresource of Deployments, ReplicaSets and StatefulSets: an `autoscaling/v1` Scale.

GET reads spec.replicas, status.replicas and the selector; PUT and PATCH write spec.replicas only.
This is what `kubectl scale` and the HorizontalPodAutoscaler use.
"""

from __future__ import annotations

from typing import Any

import aiohttp.web

from tessera.devcluster.apiserver import errors
from tessera.devcluster.apiserver.patching import apply_patch
from tessera.devcluster.apiserver.resources import ResourceType
from tessera.devcluster.apiserver.store import ObjectStore


def to_scale(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    match_labels = (spec.get("selector") or {}).get("matchLabels") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta.get("creationTimestamp"),
        },
        "spec": {"replicas": int(spec.get("replicas", 1))},
        "status": {
            "replicas": int(status.get("replicas", 0)),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(match_labels.items())),
        },
    }


def handle(
    store: ObjectStore,
    resource: ResourceType,
    namespace: str | None,
    name: str,
    method: str,
    body: Any,
    request: aiohttp.web.BaseRequest,
) -> dict[str, Any]:
    current = store.get(resource, namespace, name)
    if method == "GET":
        return to_scale(current)
    if method == "PUT":
        wanted = body
    elif method == "PATCH":
        content_type = request.headers.get("Content-Type", "application/merge-patch+json")
        wanted = apply_patch(to_scale(current), body, content_type)
    else:
        raise errors.method_not_allowed(f"{method} is not allowed on {resource.plural}/scale")
    if not isinstance(wanted, dict):
        raise errors.bad_request("a Scale must be a JSON object")
    replicas = (wanted.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise errors.invalid(
            "Scale", name, "spec.replicas", f"Invalid value: {replicas!r}: must be a non-negative integer"
        )
    stale = (wanted.get("metadata") or {}).get("resourceVersion")
    if method == "PUT" and stale and stale != current["metadata"]["resourceVersion"]:
        raise errors.conflict(
            resource.plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
            resource.group,
        )

    def set_replicas(obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {})["replicas"] = replicas

    return to_scale(store.mutate(resource, namespace, name, set_replicas))
