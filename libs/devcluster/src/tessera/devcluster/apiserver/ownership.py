"""Owner references and the garbage collector's cascading deletion.

A DELETE carries a propagationPolicy (kubectl sends `Background`): `Background` deletes the owner at
once and its dependents after it (the garbage-collector controller does that, from the owner's
DELETED event), `Foreground` deletes the dependents first, and `Orphan` removes the owner's
reference from its dependents and leaves them. Without a policy, a `batch/v1` Job orphans its pods,
as the real server's Job strategy does for compatibility, and everything else deletes in background.
"""

from __future__ import annotations

from typing import Any

from tessera.devcluster.apiserver import errors
from tessera.devcluster.apiserver.errors import ApiError
from tessera.devcluster.apiserver.resources import (
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    JOBSETS,
    LEADERWORKERSETS,
    PODGROUPS,
    PODS,
    REPLICASETS,
    SERVICES,
    STATEFULSETS,
    ResourceType,
)
from tessera.devcluster.apiserver.store import ObjectStore

POLICIES = ("Background", "Foreground", "Orphan")
# The kinds of owners the devcluster can look up (any object may be a dependent).
DEPENDENT_TYPES: tuple[ResourceType, ...] = (PODS, JOBS, REPLICASETS, SERVICES, PODGROUPS, CONFIGMAPS)
OWNER_TYPES: tuple[ResourceType, ...] = (
    JOBS,
    JOBSETS,
    REPLICASETS,
    DEPLOYMENTS,
    STATEFULSETS,
    LEADERWORKERSETS,
)
_OWNER_TYPES = {(t.api_version, t.kind): t for t in (*DEPENDENT_TYPES, *OWNER_TYPES)}


def owner_reference(owner: dict[str, Any], *, controller: bool = True) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the object's managing controller (its ownerReference with controller: true)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def controller_of(obj: dict[str, Any], kind: str) -> str | None:
    """The name of the object's managing controller when it is of this kind."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") == kind:
            return str(ref.get("name"))
    return None


def propagation_policy(resource: ResourceType, body: Any, query_value: str | None) -> str:
    options = body if isinstance(body, dict) else {}
    policy = options.get("propagationPolicy") or query_value
    if policy is None and options.get("orphanDependents") is not None:
        policy = "Orphan" if options["orphanDependents"] else "Background"
    if policy is None:
        return "Orphan" if resource == JOBS else "Background"
    if policy not in POLICIES:
        raise errors.bad_request(
            f'propagationPolicy: Unsupported value: "{policy}": supported values: "Background", '
            '"Foreground", "Orphan"'
        )
    return str(policy)


def dependents(store: ObjectStore, owner_uid: str) -> list[tuple[ResourceType, dict[str, Any]]]:
    return store.owned_keys(owner_uid)


def orphan_dependents(store: ObjectStore, owner_uid: str) -> None:
    def drop(obj: dict[str, Any]) -> None:
        refs = [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid]
        if refs:
            obj["metadata"]["ownerReferences"] = refs
        else:
            obj["metadata"].pop("ownerReferences", None)

    for rtype, item in dependents(store, owner_uid):
        _ignore_missing(lambda rtype=rtype, item=item: store.mutate(rtype, _ns(item), _name(item), drop))


def delete_dependents(store: ObjectStore, owner_uid: str) -> None:
    """Delete what the owner owns, depth first; a dependent with another live owner only loses its
    reference to this one, as the garbage collector does."""
    for rtype, item in dependents(store, owner_uid):
        others = [
            r
            for r in item["metadata"].get("ownerReferences") or []
            if r.get("uid") != owner_uid and _owner_exists(store, r, _ns(item))
        ]
        if others:
            orphan_one = _dropping(owner_uid)
            _ignore_missing(
                lambda rtype=rtype, item=item, change=orphan_one: store.mutate(
                    rtype, _ns(item), _name(item), change
                )
            )
            continue
        delete_dependents(store, item["metadata"]["uid"])
        _ignore_missing(lambda rtype=rtype, item=item: store.delete(rtype, _ns(item), _name(item)))


def _dropping(owner_uid: str) -> Any:
    def drop(obj: dict[str, Any]) -> None:
        obj["metadata"]["ownerReferences"] = [
            r for r in obj["metadata"].get("ownerReferences") or [] if r.get("uid") != owner_uid
        ]

    return drop


def _owner_exists(store: ObjectStore, ref: dict[str, Any], namespace: str | None) -> bool:
    rtype = _OWNER_TYPES.get((str(ref.get("apiVersion")), str(ref.get("kind"))))
    if rtype is None:
        return True  # an owner the devcluster does not know: keep the dependent, as the GC would
    found = store.find(rtype, namespace, str(ref.get("name")))
    return found is not None and found["metadata"].get("uid") == ref.get("uid")


def _ignore_missing(action: Any) -> None:
    try:
        action()
    except ApiError as exc:
        if exc.code != 404:
            raise


def _ns(obj: dict[str, Any]) -> str | None:
    namespace = obj["metadata"].get("namespace")
    return str(namespace) if namespace else None


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])
