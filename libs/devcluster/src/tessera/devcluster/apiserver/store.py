"""The object store behind the devcluster API server.

It keeps the objects and their indexes; its revisions, history of events and live watches are a
`RevisionLog` (tessera.devcluster.apiserver.revisions: resourceVersions, 410 Gone, and reservation
of revisions by a persisted store), and the rules of each write are pure functions in
tessera.devcluster.apiserver.writes. Every method is thread-safe, so the simulation and tests may
call it from any thread while the HTTP server runs on its event loop.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import random
import threading
from collections.abc import Callable, Mapping
from typing import Any

from tessera.devcluster.apiserver import errors, semantics, writes
from tessera.devcluster.apiserver.clock import rfc3339_now
from tessera.devcluster.apiserver.indexes import Key, StoreIndexes
from tessera.devcluster.apiserver.patching import STRATEGIC_MERGE_PATCH, apply_patch
from tessera.devcluster.apiserver.resources import PODS, ResourceType
from tessera.devcluster.apiserver.revisions import REVISION_BLOCK, RevisionLog
from tessera.devcluster.apiserver.selectors import Selector
from tessera.devcluster.apiserver.watching import StoredEvent, Watch


class ObjectStore:
    def __init__(self, history: int = 10_000) -> None:
        self._log = RevisionLog(history)
        self._lock = threading.RLock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._indexes = StoreIndexes()
        self._random = random.Random()

    # ---- reads -------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        with self._lock:
            return self._log.revision

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
            return items, self._log.revision

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
        ns = writes.namespace_for(resource, namespace, metadata.get("namespace"))
        with self._lock:
            name = metadata.get("name")
            if not name:
                prefix = metadata.get("generateName")
                if not prefix:
                    raise errors.invalid(
                        resource.kind, "", "metadata.name", "name or generateName is required"
                    )
                name = writes.generate_name(
                    self._random, prefix, lambda candidate: (resource, ns, candidate) in self._objects
                )
            semantics.validate_name(resource, name)
            key = (resource, ns, name)
            if key in self._objects:
                raise errors.already_exists(resource.plural, name, resource.group)
            writes.give_identity(resource, obj, name, ns)
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
        writes.check_replacement(resource, name, body)
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
        metadata = writes.check_apply_configuration(resource, name, body)
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
        *,
        copy_result: bool = True,
    ) -> dict[str, Any]:
        """Change an object in place, status included, as a controller would; no-op changes write nothing.

        The object as written comes back as a copy; with ``copy_result`` false, the stored object
        itself, for a caller that only reads it (the store never changes an object it holds)."""
        with self._lock:
            old = self._require(resource, namespace, name)
            new = copy.deepcopy(old)
            change(new)
            if new == old:
                return copy.deepcopy(old) if copy_result else old
            key = self._key(resource, namespace, name)
            written = self._commit(key, writes.keep_identity(old, new), "MODIFIED", old)
            return copy.deepcopy(written) if copy_result else written

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
            meta = old["metadata"]
            writes.check_delete_preconditions(resource, name, meta, preconditions or {})
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
        *,
        copy_result: bool = True,
    ) -> dict[str, Any]:
        """pods/binding: assign a pod to a node once; a second binding, or binding a pod that
        scheduling gates still hold, is 409 Conflict. As the API server's binding storage does, the
        Binding's annotations are written onto the pod in the same update, and its ``uid`` and
        ``resourceVersion`` (``preconditions``), when given, must be the pod's (409 otherwise).
        The pod bound comes back as a copy, or with ``copy_result`` false the stored one (see
        :meth:`mutate`)."""
        if not node_name:
            raise errors.invalid("Binding", pod_name, "target.name", "Required value: a node name")
        with self._lock:
            old = self._require(PODS, namespace, pod_name)
            new = writes.bound_pod(old, pod_name, node_name, annotations, preconditions)
            written = self._commit(self._key(PODS, namespace, pod_name), new, "MODIFIED", old)
            return copy.deepcopy(written) if copy_result else written

    # ---- snapshots (see tessera.devcluster.persistence) ---------------------------------------

    def contents(self) -> tuple[int, builtins.list[tuple[ResourceType, dict[str, Any]]]]:
        """The revision and every stored object with its type. The objects are the stored ones, not
        copies: they are replaced on write, never changed, so a reader may serialise them unlocked."""
        with self._lock:
            return self._log.revision, [(key[0], obj) for key, obj in self._objects.items()]

    def restore(self, revision: int, objects: builtins.list[tuple[ResourceType, dict[str, Any]]]) -> None:
        """Replace everything with ``objects`` at ``revision``, before anyone watches. The history
        starts empty: a watch from an older resourceVersion gets 410 Gone and relists."""
        with self._lock:
            if self._log.watched:
                raise RuntimeError("restore: the store is being watched; restore before serving")
            self._objects, self._indexes = {}, StoreIndexes()
            for resource, obj in objects:
                meta = obj["metadata"]
                key = self._key(resource, meta.get("namespace"), meta["name"])
                self._objects[key] = obj
                self._indexes.stored(key, None, obj)
            self._log.restart_at(revision)

    def resume_after(self, reserved: int) -> None:
        """Go on past ``reserved``, the newest revision a run before a crash may have handed out (its
        writes after its last snapshot are lost): the store's state takes the revision after it, one
        no one has seen, and a watch from any earlier resourceVersion gets 410 Gone and relists."""
        with self._lock:
            if self._log.watched:
                raise RuntimeError("resume_after: the store is being watched; call it before serving")
            self._log.resume_after(reserved)

    def reserve_revisions(self, reserve: Callable[[int], None], block: int = REVISION_BLOCK) -> None:
        """Before a write takes a revision past those reserved, call ``reserve`` with the newest of the
        next ``block``; it must record it durably before it returns (the revisions are used after)."""
        with self._lock:
            self._log.reserve_revisions(reserve, block)

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
                backlog = self._log.replay(resource, namespace, selector, resource_version)
            watch = Watch(resource, namespace, selector, loop, backlog, self._forget)
            self._log.add_watch(watch)
            return watch

    def close_watches(self) -> None:
        with self._lock:
            watches = self._log.watches()
        for watch in watches:
            watch.close()

    def _forget(self, watch: Watch) -> None:
        with self._lock:
            self._log.forget(watch)

    # ---- internals ---------------------------------------------------------------------------

    def _key(self, resource: ResourceType, namespace: str | None, name: str) -> Key:
        return (resource, (namespace or "") if resource.namespaced else "", name)

    def _require(self, resource: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self._objects.get(self._key(resource, namespace, name))
        if obj is None:
            raise errors.not_found(resource.plural, name, resource.group)
        return obj

    def _write(
        self, resource: ResourceType, old: dict[str, Any], new: dict[str, Any], subresource: str | None
    ) -> dict[str, Any]:
        name = old["metadata"]["name"]
        writes.check_resource_version(resource, old, new)
        new = semantics.merge_subresource(resource, old, new, subresource)
        new = writes.keep_identity(old, new)
        if subresource != "status":
            semantics.validate_update(resource, old, new)
        key = self._key(resource, old["metadata"].get("namespace"), name)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            return self._remove(key, old)
        if writes.unchanged(old, new):
            return old  # a no-op write does not bump the resourceVersion, as in Kubernetes
        return self._commit(key, new, "MODIFIED", old)

    def _commit(self, key: Key, obj: dict[str, Any], kind: str, old: dict[str, Any] | None) -> dict[str, Any]:
        revision = self._log.next_revision()
        obj["metadata"]["resourceVersion"] = str(revision)
        self._objects[key] = obj
        self._indexes.stored(key, old, obj)
        self._log.publish(StoredEvent(revision, kind, key[0], key[1], obj, old))
        return obj

    def _remove(self, key: Key, old: dict[str, Any]) -> dict[str, Any]:
        revision = self._log.next_revision()
        last = copy.deepcopy(old)
        last["metadata"]["resourceVersion"] = str(revision)
        del self._objects[key]
        self._indexes.removed(key, old)
        self._log.publish(StoredEvent(revision, "DELETED", key[0], key[1], last, old))
        return last
