"""The rules of a write to the object store, as pure functions of the objects involved.

The identity a created object is given and an updated one keeps, the namespace a request writes in,
generated names, the preconditions of a write (409 Conflict when one fails), what makes a write a
no-op, and a pod's binding to a node. The store applies them under its lock.
"""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from tessera.devcluster.apiserver import errors, semantics
from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.resources import ResourceType

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_TRANSIENT = ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion")


def check_replacement(resource: ResourceType, name: str, body: Any) -> None:
    """400 unless the body of a PUT is an object whose name, when it has one, is the URL's."""
    if not isinstance(body, dict):
        raise errors.bad_request(f"the body of a {resource.kind} must be a JSON object")
    body_name = (body.get("metadata") or {}).get("name")
    if body_name is not None and body_name != name:
        raise errors.bad_request(
            f"the name of the object ({body_name}) does not match the name on the URL ({name})"
        )


def check_apply_configuration(resource: ResourceType, name: str, body: Any) -> dict[str, Any]:
    """The metadata of a server-side apply configuration; 400 unless it is an object of the type,
    whose name, when it has one, is the URL's."""
    if not isinstance(body, dict):
        raise errors.bad_request("an apply configuration must be an object")
    metadata: dict[str, Any] = body.get("metadata") or {}
    if metadata.get("name", name) != name:
        raise errors.bad_request(
            f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})"
        )
    if (body.get("apiVersion"), body.get("kind")) != (resource.api_version, resource.kind):
        raise errors.bad_request(
            f"an apply configuration of {resource} must be {resource.api_version} {resource.kind}"
        )
    return metadata


def namespace_for(resource: ResourceType, from_url: str | None, from_body: str | None) -> str:
    """The namespace a write goes to: "" for a cluster-scoped type; 400 when the URL's and the
    body's differ, or when a namespaced object has neither."""
    if not resource.namespaced:
        return ""
    if from_url and from_body and from_url != from_body:
        raise errors.bad_request(
            f"the namespace of the provided object ({from_body}) does not match the namespace "
            f"sent on the request ({from_url})"
        )
    namespace = from_url or from_body
    if not namespace:
        raise errors.bad_request(f"{resource.kind} is namespaced: metadata.namespace is required")
    return namespace


def generate_name(rng: random.Random, prefix: str, taken: Callable[[str], bool]) -> str:
    """``prefix`` (cut to 58 characters) and five random characters, a name not ``taken``."""
    for _ in range(100):
        suffix = "".join(rng.choice(_GENERATE_ALPHABET) for _ in range(5))
        name = f"{prefix[:58]}{suffix}"
        if not taken(name):
            return name
    raise errors.ApiError(500, "AlreadyExists", f"could not generate a unique name from {prefix!r}")


def give_identity(resource: ResourceType, obj: dict[str, Any], name: str, namespace: str) -> None:
    """Stamp a new object: its name, a fresh uid, its creation time, generation 1, its namespace
    (none when cluster-scoped), its type; what only a stored object carries is dropped."""
    metadata = obj["metadata"]
    metadata.update(
        name=name,
        uid=str(uuid.uuid4()),
        creationTimestamp=rfc3339_now(),
        generation=1,
    )
    if resource.namespaced:
        metadata["namespace"] = namespace
    else:
        metadata.pop("namespace", None)
    for transient in _TRANSIENT:
        metadata.pop(transient, None)
    obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind


def keep_identity(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the identity of ``old``, its generation bumped when the spec changed."""
    meta_old, meta_new = old["metadata"], new.setdefault("metadata", {})
    for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
        if field in meta_old:
            meta_new[field] = meta_old[field]
        else:
            meta_new.pop(field, None)
    meta_new["generation"] = meta_old.get("generation", 1) + (old.get("spec") != new.get("spec"))
    new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
    return new


def check_resource_version(resource: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> None:
    """409 Conflict when ``new`` carries a resourceVersion other than the stored one."""
    wanted = (new.get("metadata") or {}).get("resourceVersion")
    if wanted and str(wanted) != old["metadata"]["resourceVersion"]:
        raise errors.conflict(
            resource.plural,
            old["metadata"]["name"],
            "the object has been modified; please apply your changes to the latest version and try again",
            resource.group,
        )


def check_delete_preconditions(
    resource: ResourceType, name: str, meta: Mapping[str, Any], preconditions: Mapping[str, Any]
) -> None:
    """409 Conflict when the ``uid`` or ``resourceVersion`` precondition is not the object's."""
    for field in ("uid", "resourceVersion"):
        wanted = preconditions.get(field)
        if wanted and wanted != meta.get(field):
            raise errors.conflict(
                resource.plural,
                name,
                f"Precondition failed: {field} in precondition: {wanted}, "
                f"{field} in object meta: {meta.get(field)}",
                resource.group,
            )


def unchanged(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether writing ``new`` over ``old`` changes nothing but the resourceVersion it carries (a
    no-op write does not bump the resourceVersion, as in Kubernetes)."""
    meta = new["metadata"]
    return {k: v for k, v in new.items() if k != "metadata"} == {
        k: v for k, v in old.items() if k != "metadata"
    } and (
        {k: v for k, v in meta.items() if k != "resourceVersion"}
        == {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}
    )


def bound_pod(
    old: dict[str, Any],
    pod_name: str,
    node_name: str,
    annotations: Mapping[str, str] | None,
    preconditions: Mapping[str, str] | None,
) -> dict[str, Any]:
    """The pod bound to the node, with the Binding's annotations and a PodScheduled condition; 409
    Conflict when the preconditions fail, or when the pod is bound, being deleted or gated."""
    for field, wanted in (preconditions or {}).items():
        if wanted and str(wanted) != str(old["metadata"].get(field)):
            raise errors.conflict(
                "pods/binding",
                pod_name,
                f"Precondition failed: {field}: {wanted} != {old['metadata'].get(field)}",
            )
    current = (old.get("spec") or {}).get("nodeName")
    if current:
        raise errors.conflict(
            "pods/binding", pod_name, f'pod {pod_name} is already assigned to node "{current}"'
        )
    if old["metadata"].get("deletionTimestamp"):
        raise errors.conflict("pods/binding", pod_name, f"pod {pod_name} is being deleted")
    if (old.get("spec") or {}).get("schedulingGates"):  # as the API server's binding storage
        raise errors.conflict("pods/binding", pod_name, f"pod {pod_name} has non-empty .spec.schedulingGates")
    new = copy.deepcopy(old)
    new["spec"]["nodeName"] = node_name
    if annotations:
        new["metadata"]["annotations"] = {**(new["metadata"].get("annotations") or {}), **annotations}
    conditions = [c for c in new["status"].get("conditions", []) if c.get("type") != "PodScheduled"]
    new["status"]["conditions"] = [*conditions, semantics.pod_scheduled_condition()]
    return new
