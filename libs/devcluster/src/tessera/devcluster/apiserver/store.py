"""The object store behind the devcluster API server.

One global, monotonically increasing resourceVersion orders every write, as etcd's revision does.
A bounded history of events lets watchers resume from a resourceVersion; a watcher asking for one
older than the history, or newer than the store's revision, gets 410 Gone and must relist. Every
method is thread-safe, so the simulation and tests may call it from any thread while the HTTP server
runs on its event loop.

A store that is persisted (see tessera.devcluster.persistence) reserves its revisions a block at a
time, recording the block's ceiling before it uses any of it. Restarted after a crash, it restores
the last snapshot and goes on past that ceiling (`resume_after`): no resourceVersion a watcher or a
writer may have seen before the crash is ever given to something else, and a watch from one of them
gets 410 Gone, since the events after the snapshot are lost.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import copy
import random
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from tessera.devcluster.apiserver import errors, semantics
from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.indexes import Key, StoreIndexes
from tessera.devcluster.apiserver.patching import STRATEGIC_MERGE_PATCH, apply_patch
from tessera.devcluster.apiserver.resources import PODS, ResourceType
from tessera.devcluster.apiserver.selectors import Selector
from tessera.devcluster.apiserver.watching import StoredEvent, Watch

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
REVISION_BLOCK = 10_000
"""How many revisions a persisted store reserves at a time (one small synchronous write each)."""


class ObjectStore:
    def __init__(self, history: int = 10_000) -> None:
        if history < 1:
            raise ValueError(f"history must be at least 1, got {history}")
        self._lock = threading.RLock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._indexes = StoreIndexes()
        self._revision = 0
        self._history: collections.deque[StoredEvent] = collections.deque(maxlen=history)
        self._compacted = 0  # the newest revision no longer in the history
        self._watches: set[Watch] = set()
        self._random = random.Random()
        self._reserve: Callable[[int], None] | None = None
        self._reserved = 0  # the newest revision reserved; the next write past it reserves a block
        self._block = REVISION_BLOCK

    # ---- reads -------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        with self._lock:
            return self._revision

    def get(self, resource: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._require(resource, namespace, name))

    def find(self, resource: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._objects.get(self._key(resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(
        self, resource: ResourceType, namespace: str | None = None, selector: Selector | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """Matching objects (sorted by namespace and name) and the revision they were read at."""
        selector = selector or Selector()
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (_, ns, _), obj in self._indexes.of_type(resource)
                if (namespace is None or ns == namespace) and selector.matches(obj)
            ]
            return items, self._revision

    def owned_by(
        self, owner_uid: str, resource: ResourceType | None = None, *, copy_objects: bool = True
    ) -> builtins.list[dict[str, Any]]:
        """The objects (of one type, or all) whose ownerReferences name the uid, by namespace and name.
        `copy_objects=False` hands out the stored objects themselves, for callers that only read them
        (the controllers, which reconcile often); they must not be changed."""
        with self._lock:
            keys = self._indexes.owned(owner_uid, resource)
            if not copy_objects:
                return [self._objects[k] for k in keys]
            return [copy.deepcopy(self._objects[k]) for k in keys]

    def owned_keys(self, owner_uid: str) -> builtins.list[tuple[ResourceType, dict[str, Any]]]:
        """Like `owned_by`, with each object's type."""
        with self._lock:
            return [(k[0], copy.deepcopy(self._objects[k])) for k in self._indexes.owned(owner_uid)]

    # ---- writes ------------------------------------------------------------------------------

    def create(self, resource: ResourceType, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        if not isinstance(obj, dict):
            raise errors.bad_request(f"the body of a {resource.kind} must be a JSON object")
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise errors.bad_request("metadata must be a JSON object")
        ns = self._namespace_for(resource, namespace, metadata.get("namespace"))
        with self._lock:
            name = metadata.get("name")
            if not name:
                prefix = metadata.get("generateName")
                if not prefix:
                    raise errors.invalid(
                        resource.kind, "", "metadata.name", "name or generateName is required"
                    )
                name = self._generate_name(resource, ns, prefix)
            semantics.validate_name(resource, name)
            key = (resource, ns, name)
            if key in self._objects:
                raise errors.already_exists(resource.plural, name, resource.group)
            metadata.update(
                name=name,
                uid=str(uuid.uuid4()),
                creationTimestamp=rfc3339_now(),
                generation=1,
            )
            if resource.namespaced:
                metadata["namespace"] = ns
            else:
                metadata.pop("namespace", None)
            for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
                metadata.pop(transient, None)
            obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
            semantics.prepare_for_create(resource, obj)
            return copy.deepcopy(self._commit(key, obj, "ADDED", None))

    def replace(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        body: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PUT: a conditional replace when the body carries a resourceVersion (409 when stale)."""
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of a {resource.kind} must be a JSON object")
        body_name = (body.get("metadata") or {}).get("name")
        if body_name is not None and body_name != name:
            raise errors.bad_request(
                f"the name of the object ({body_name}) does not match the name on the URL ({name})"
            )
        with self._lock:
            old = self._require(resource, namespace, name)
            return copy.deepcopy(self._write(resource, old, copy.deepcopy(body), subresource))

    def patch(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        patch: Any,
        content_type: str,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            old = self._require(resource, namespace, name)
            patched = apply_patch(copy.deepcopy(old), patch, content_type)
            if not (isinstance(patch, dict) and (patch.get("metadata") or {}).get("resourceVersion")):
                patched.setdefault("metadata", {})["resourceVersion"] = old["metadata"]["resourceVersion"]
            return copy.deepcopy(self._write(resource, old, patched, subresource))

    def apply(
        self, resource: ResourceType, namespace: str | None, name: str, body: Any
    ) -> tuple[dict[str, Any], bool]:
        """Server-side apply, simplified: create the object, or merge the applied configuration into
        it as a strategic merge patch. Fields are not owned by managers, so a field left out of a
        later configuration stays (the real server removes what the same manager set before).
        Returns the object and whether it was created."""
        if not isinstance(body, dict):
            raise errors.bad_request("an apply configuration must be an object")
        metadata = body.get("metadata") or {}
        if metadata.get("name", name) != name:
            raise errors.bad_request(
                f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})"
            )
        if (body.get("apiVersion"), body.get("kind")) != (resource.api_version, resource.kind):
            raise errors.bad_request(
                f"an apply configuration of {resource} must be {resource.api_version} {resource.kind}"
            )
        with self._lock:
            if self._objects.get(self._key(resource, namespace, name)) is None:
                created = {**body, "metadata": {**metadata, "name": name}}
                return self.create(resource, namespace, created), True
            return self.patch(resource, namespace, name, body, STRATEGIC_MERGE_PATCH), False

    def mutate(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        change: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any]:
        """Change an object in place, status included, as a controller would; no-op changes write nothing."""
        with self._lock:
            old = self._require(resource, namespace, name)
            new = copy.deepcopy(old)
            change(new)
            if new == old:
                return copy.deepcopy(old)
            key = self._key(resource, namespace, name)
            return copy.deepcopy(self._commit(key, self._keep_identity(old, new), "MODIFIED", old))

    def delete(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        preconditions: dict[str, Any] | None = None,
        before: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Delete the object, or mark it deleted while finalizers hold it. Its ``uid`` and
        ``resourceVersion`` preconditions, when given, must hold (409 Conflict, nothing written);
        then ``before`` is called with it, under the store's lock, ahead of the delete itself (a
        propagation policy's work on the dependents)."""
        with self._lock:
            old = self._require(resource, namespace, name)
            preconditions = preconditions or {}
            meta = old["metadata"]
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
            if before is not None:
                before(old)
                old = self._require(resource, namespace, name)
                meta = old["metadata"]
            key = self._key(resource, namespace, name)
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return copy.deepcopy(old)
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = rfc3339_now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return copy.deepcopy(self._commit(key, new, "MODIFIED", old))
            return copy.deepcopy(self._remove(key, old))

    def bind(
        self,
        namespace: str,
        pod_name: str,
        node_name: str,
        annotations: Mapping[str, str] | None = None,
        preconditions: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """pods/binding: assign a pod to a node once; a second binding, or binding a pod that
        scheduling gates still hold, is 409 Conflict. As the API server's binding storage does, the
        Binding's annotations are written onto the pod in the same update, and its ``uid`` and
        ``resourceVersion`` (``preconditions``), when given, must be the pod's (409 otherwise)."""
        if not node_name:
            raise errors.invalid("Binding", pod_name, "target.name", "Required value: a node name")
        with self._lock:
            old = self._require(PODS, namespace, pod_name)
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
                raise errors.conflict(
                    "pods/binding", pod_name, f"pod {pod_name} has non-empty .spec.schedulingGates"
                )
            new = copy.deepcopy(old)
            new["spec"]["nodeName"] = node_name
            if annotations:
                new["metadata"]["annotations"] = {**(new["metadata"].get("annotations") or {}), **annotations}
            conditions = [c for c in new["status"].get("conditions", []) if c.get("type") != "PodScheduled"]
            new["status"]["conditions"] = [*conditions, semantics.pod_scheduled_condition()]
            return copy.deepcopy(self._commit(self._key(PODS, namespace, pod_name), new, "MODIFIED", old))

    # ---- snapshots (see tessera.devcluster.persistence) ---------------------------------------

    def contents(self) -> tuple[int, builtins.list[tuple[ResourceType, dict[str, Any]]]]:
        """The revision and every stored object with its type. The objects are the stored ones, not
        copies: they are replaced on write, never changed, so a reader may serialise them unlocked."""
        with self._lock:
            return self._revision, [(key[0], obj) for key, obj in self._objects.items()]

    def restore(self, revision: int, objects: builtins.list[tuple[ResourceType, dict[str, Any]]]) -> None:
        """Replace everything with ``objects`` at ``revision``, before anyone watches. The history
        starts empty: a watch from an older resourceVersion gets 410 Gone and relists."""
        with self._lock:
            if self._watches:
                raise RuntimeError("restore: the store is being watched; restore before serving")
            self._objects, self._indexes, self._history = (
                {},
                StoreIndexes(),
                collections.deque(maxlen=self._history.maxlen),
            )
            for resource, obj in objects:
                meta = obj["metadata"]
                key = self._key(resource, meta.get("namespace"), meta["name"])
                self._objects[key] = obj
                self._indexes.stored(key, None, obj)
            self._revision = self._compacted = self._reserved = revision

    def resume_after(self, reserved: int) -> None:
        """Go on past ``reserved``, the newest revision a run before a crash may have handed out (its
        writes after its last snapshot are lost): the store's state takes the revision after it, one
        no one has seen, and a watch from any earlier resourceVersion gets 410 Gone and relists."""
        with self._lock:
            if self._watches:
                raise RuntimeError("resume_after: the store is being watched; call it before serving")
            if reserved >= self._revision:
                self._revision = self._compacted = self._reserved = reserved + 1
                self._history.clear()

    def reserve_revisions(self, reserve: Callable[[int], None], block: int = REVISION_BLOCK) -> None:
        """Before a write takes a revision past those reserved, call ``reserve`` with the newest of the
        next ``block``; it must record it durably before it returns (the revisions are used after)."""
        if block < 1:
            raise ValueError(f"block must be at least 1, got {block}")
        with self._lock:
            self._reserve, self._block, self._reserved = reserve, block, self._revision

    # ---- watches -----------------------------------------------------------------------------

    def watch(
        self,
        resource: ResourceType,
        namespace: str | None = None,
        selector: Selector | None = None,
        resource_version: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Watch:
        """Subscribe to changes; call from a coroutine (the watch delivers on that event loop).

        Without a resourceVersion (or with "0") the watch starts with a synthetic ADDED event for
        every matching object, as the real server does; with one, it replays what happened after it.
        """
        selector = selector or Selector()
        loop = loop or asyncio.get_running_loop()
        with self._lock:
            backlog: list[dict[str, Any]] = []
            if resource_version in (None, "", "0"):
                backlog = [
                    {"type": "ADDED", "object": obj}
                    for (_, ns, _), obj in self._indexes.of_type(resource)
                    if (namespace is None or ns == namespace) and selector.matches(obj)
                ]
            else:
                since = _parse_revision(resource_version)
                if since < self._compacted:
                    raise errors.gone(f"too old resource version: {since} ({self._compacted + 1})")
                if since > self._revision:  # seen before a crash, or given by another server
                    raise errors.gone(f"Too large resource version: {since}, current: {self._revision}")
                for event in self._history:
                    if event.resource_version > since and event.resource == resource:
                        seen = event.seen_through(namespace, selector)
                        if seen is not None:
                            backlog.append(seen)
            watch = Watch(resource, namespace, selector, loop, backlog, self._forget)
            self._watches.add(watch)
            return watch

    def close_watches(self) -> None:
        with self._lock:
            watches = list(self._watches)
        for watch in watches:
            watch.close()

    def _forget(self, watch: Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    # ---- internals ---------------------------------------------------------------------------

    def _key(self, resource: ResourceType, namespace: str | None, name: str) -> Key:
        return (resource, (namespace or "") if resource.namespaced else "", name)

    def _require(self, resource: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._objects.get(self._key(resource, namespace, name))
        if obj is None:
            raise errors.not_found(resource.plural, name, resource.group)
        return obj

    def _namespace_for(self, resource: ResourceType, from_url: str | None, from_body: str | None) -> str:
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

    def _generate_name(self, resource: ResourceType, namespace: str, prefix: str) -> str:
        for _ in range(100):
            suffix = "".join(self._random.choice(_GENERATE_ALPHABET) for _ in range(5))
            name = f"{prefix[:58]}{suffix}"
            if (resource, namespace, name) not in self._objects:
                return name
        raise errors.ApiError(500, "AlreadyExists", f"could not generate a unique name from {prefix!r}")

    def _keep_identity(self, old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        meta_old, meta_new = old["metadata"], new.setdefault("metadata", {})
        for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if field in meta_old:
                meta_new[field] = meta_old[field]
            else:
                meta_new.pop(field, None)
        meta_new["generation"] = meta_old.get("generation", 1) + (old.get("spec") != new.get("spec"))
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        return new

    def _write(
        self, resource: ResourceType, old: dict[str, Any], new: dict[str, Any], subresource: str | None
    ) -> dict[str, Any]:
        name = old["metadata"]["name"]
        wanted = (new.get("metadata") or {}).get("resourceVersion")
        if wanted and str(wanted) != old["metadata"]["resourceVersion"]:
            raise errors.conflict(
                resource.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
                resource.group,
            )
        new = semantics.merge_subresource(resource, old, new, subresource)
        new = self._keep_identity(old, new)
        if subresource != "status":
            semantics.validate_update(resource, old, new)
        key = self._key(resource, old["metadata"].get("namespace"), name)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(key, old)
        if {k: v for k, v in new.items() if k != "metadata"} == {
            k: v for k, v in old.items() if k != "metadata"
        } and (
            {k: v for k, v in meta.items() if k != "resourceVersion"}
            == {k: v for k, v in old["metadata"].items() if k != "resourceVersion"}
        ):
            return old  # a no-op write does not bump the resourceVersion, as in Kubernetes
        return self._commit(key, new, "MODIFIED", old)

    def _next_revision(self) -> int:
        revision = self._revision + 1
        if self._reserve is not None and revision > self._reserved:
            self._reserve(revision + self._block - 1)
            self._reserved = revision + self._block - 1
        self._revision = revision
        return revision

    def _commit(self, key: Key, obj: dict[str, Any], kind: str, old: dict[str, Any] | None) -> dict[str, Any]:
        self._next_revision()
        obj["metadata"]["resourceVersion"] = str(self._revision)
        self._objects[key] = obj
        self._indexes.stored(key, old, obj)
        self._publish(StoredEvent(self._revision, kind, key[0], key[1], obj, old))
        return obj

    def _remove(self, key: Key, old: dict[str, Any]) -> dict[str, Any]:
        self._next_revision()
        last = copy.deepcopy(old)
        last["metadata"]["resourceVersion"] = str(self._revision)
        del self._objects[key]
        self._indexes.removed(key, old)
        self._publish(StoredEvent(self._revision, "DELETED", key[0], key[1], last, old))
        return last

    def _publish(self, event: StoredEvent) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0].resource_version
        self._history.append(event)
        for watch in list(self._watches):
            watch.offer(event)


def _parse_revision(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise errors.bad_request(f"resourceVersion {text!r} is not a valid revision") from None
    if value < 0:
        raise errors.bad_request(f"resourceVersion {text!r} must not be negative")
    return value
