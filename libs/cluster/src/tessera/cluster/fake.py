"""An in-memory `Cluster` for unit tests: the same semantics as the Kubernetes adapter, no server.

Objects carry resourceVersions from one counter, watches replay a history and then follow live
changes (an object leaving a selector is DELETED for that watcher, as the API server does it),
and a compacted history answers an old resourceVersion with `WatchExpired`. Test hooks:
``add_node``/``add_pod``/``add_pod_group``/``delete_pod`` change the cluster as someone else would,
``close_watches`` ends the open streams (a server timeout), ``compact`` forgets the history (410),
``block_eviction`` makes a budget refuse an eviction, and ``bindings``/``evictions`` record calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.cluster.conventions.assignment import encode_assignment
from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION
from tessera.cluster.conventions.nodes import node_manifest, parse_node
from tessera.cluster.domain.allocation import DeviceAssignment
from tessera.cluster.domain.node import Node
from tessera.cluster.domain.requirements import Pod, PodGroup, PodRef
from tessera.cluster.port import (
    AlreadyBound,
    ConfigMap,
    ConfigMapMutation,
    Conflict,
    EventType,
    EvictionBlocked,
    Listing,
    NotFound,
    PodSelector,
    WatchEvent,
    WatchExpired,
)
from tessera.cluster.retry import update_config_map_with_retry

_NODES, _PODS, _GROUPS = "nodes", "pods", "podgroups"


@dataclass(frozen=True, slots=True)
class _Change:
    revision: int
    kind: str
    type: EventType
    obj: Any
    old: Any

    def seen_by(self, predicate: Callable[[Any], bool]) -> WatchEvent[Any] | None:
        rv = str(self.revision)
        if self.type is EventType.DELETED:
            return WatchEvent(EventType.DELETED, self.obj, rv) if predicate(self.obj) else None
        now = predicate(self.obj)
        before = self.old is not None and predicate(self.old)
        if now and before:
            return WatchEvent(EventType.MODIFIED, self.obj, rv)
        if now:
            return WatchEvent(EventType.ADDED, self.obj, rv)
        if before:
            return WatchEvent(EventType.DELETED, self.obj, rv)
        return None


@dataclass(eq=False)
class _Watcher:
    kind: str
    predicate: Callable[[Any], bool]
    queue: asyncio.Queue[WatchEvent[Any] | None]


class FakeCluster:
    def __init__(self) -> None:
        self._revision = 0
        self._compacted = 0
        self._objects: dict[str, dict[str, Any]] = {_NODES: {}, _PODS: {}, _GROUPS: {}}
        self._config_maps: dict[tuple[str, str], ConfigMap] = {}
        self._history: list[_Change] = []
        self._watchers: list[_Watcher] = []
        self._blocked: set[PodRef] = set()
        self.bindings: list[tuple[PodRef, str]] = []
        self.evictions: list[PodRef] = []

    # ---- test hooks ---------------------------------------------------------------------------

    def add_node(self, node: Node) -> Node:
        return self._put(_NODES, node.name, node)  # type: ignore[no-any-return]

    def add_pod(self, pod: Pod) -> Pod:
        return self._put(_PODS, str(pod.ref), pod)  # type: ignore[no-any-return]

    def add_pod_group(self, group: PodGroup) -> PodGroup:
        return self._put(_GROUPS, group.key, group)  # type: ignore[no-any-return]

    def delete_pod(self, ref: PodRef) -> None:
        self._delete(_PODS, str(ref))

    def delete_node(self, name: str) -> None:
        self._delete(_NODES, name)

    def write_config_map(self, namespace: str, name: str, data: Mapping[str, str]) -> ConfigMap:
        """Another writer changes a ConfigMap (bumping its resourceVersion)."""
        current = self._config_maps.get((namespace, name))
        return self._store_config_map(namespace, name, data, current.labels if current else {})

    def close_watches(self) -> None:
        for watcher in list(self._watchers):
            watcher.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the history: watches from any version seen so far now get WatchExpired."""
        self._history.clear()
        self._compacted = self._revision

    def block_eviction(self, ref: PodRef, blocked: bool = True) -> None:
        (self._blocked.add if blocked else self._blocked.discard)(ref)

    @property
    def revision(self) -> str:
        return str(self._revision)

    # ---- reads --------------------------------------------------------------------------------

    async def list_nodes(self) -> Listing[Node]:
        return Listing(tuple(self._objects[_NODES].values()), self.revision)

    def watch_nodes(self, resource_version: str) -> AsyncIterator[WatchEvent[Node]]:
        return self._watch(_NODES, resource_version, lambda node: True)

    async def list_pods(self, selector: PodSelector = PodSelector()) -> Listing[Pod]:
        return Listing(tuple(p for p in self._objects[_PODS].values() if selector.matches(p)), self.revision)

    def watch_pods(
        self, resource_version: str, selector: PodSelector = PodSelector()
    ) -> AsyncIterator[WatchEvent[Pod]]:
        return self._watch(_PODS, resource_version, selector.matches)

    async def list_pod_groups(self, namespace: str | None = None) -> Listing[PodGroup]:
        groups = self._objects[_GROUPS].values()
        return Listing(tuple(g for g in groups if namespace in (None, g.namespace)), self.revision)

    def watch_pod_groups(
        self, resource_version: str, namespace: str | None = None
    ) -> AsyncIterator[WatchEvent[PodGroup]]:
        return self._watch(_GROUPS, resource_version, lambda g: namespace in (None, g.namespace))

    async def get_pod(self, ref: PodRef) -> Pod:
        pod = self._objects[_PODS].get(str(ref))
        if pod is None:
            raise NotFound(f'pods "{ref.name}" not found in namespace {ref.namespace}')
        return pod  # type: ignore[no-any-return]

    async def get_node(self, name: str) -> Node:
        node = self._objects[_NODES].get(name)
        if node is None:
            raise NotFound(f'nodes "{name}" not found')
        return node  # type: ignore[no-any-return]

    # ---- writes -------------------------------------------------------------------------------

    async def bind(self, ref: PodRef, node: str, assignment: DeviceAssignment | None = None) -> None:
        pod = await self.get_pod(ref)
        if assignment is not None and assignment.pod_uid and assignment.pod_uid != pod.uid:
            raise Conflict(f"Precondition failed: uid: {assignment.pod_uid} != {pod.uid}")
        if pod.node_name:
            raise AlreadyBound(f'pod {ref} is already assigned to node "{pod.node_name}"')
        if pod.deleting:
            raise Conflict(f"pod {ref} is being deleted")
        annotations = dict(pod.annotations)
        if assignment is not None:
            annotations[GPU_ASSIGNMENT_ANNOTATION] = encode_assignment(assignment)
        self._put(
            _PODS,
            str(ref),
            dataclasses.replace(
                pod, node_name=node, annotations=annotations, assignment=assignment or pod.assignment
            ),
        )
        self.bindings.append((ref, node))

    async def evict(self, ref: PodRef, grace_period_seconds: int | None = None) -> None:
        await self.get_pod(ref)
        if ref in self._blocked:
            raise EvictionBlocked(f"Cannot evict pod {ref} as it would violate the pod's disruption budget")
        self._delete(_PODS, str(ref))
        self.evictions.append(ref)

    async def patch_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> Node:
        manifest = node_manifest(await self.get_node(name))
        for target, changes in (
            (manifest["metadata"]["labels"], labels),
            (manifest["metadata"]["annotations"], annotations),
        ):
            for key, value in (changes or {}).items():
                if value is None:
                    target.pop(key, None)
                else:
                    target[key] = value
        return self._put(_NODES, name, parse_node(manifest))  # type: ignore[no-any-return]

    async def cordon(self, name: str, unschedulable: bool = True) -> Node:
        node = await self.get_node(name)
        return self._put(_NODES, name, dataclasses.replace(node, unschedulable=unschedulable))  # type: ignore[no-any-return]

    async def get_config_map(self, namespace: str, name: str) -> ConfigMap | None:
        return self._config_maps.get((namespace, name))

    async def apply_config_map(
        self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str] | None = None
    ) -> ConfigMap:
        async def write(new: Mapping[str, str], current: ConfigMap | None) -> ConfigMap:
            return self._write_config_map(namespace, name, new, current, labels)

        return await update_config_map_with_retry(
            lambda: self.get_config_map(namespace, name), write, lambda _: dict(data)
        )

    async def update_config_map(self, namespace: str, name: str, mutate: ConfigMapMutation) -> ConfigMap:
        async def write(new: Mapping[str, str], current: ConfigMap | None) -> ConfigMap:
            return self._write_config_map(namespace, name, new, current, None)

        return await update_config_map_with_retry(lambda: self.get_config_map(namespace, name), write, mutate)

    # ---- internals ----------------------------------------------------------------------------

    def _write_config_map(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, str],
        read: ConfigMap | None,
        labels: Mapping[str, str] | None,
    ) -> ConfigMap:
        current = self._config_maps.get((namespace, name))
        if read is None and current is not None:
            raise Conflict(f'configmaps "{name}" already exists')
        if read is not None and (current is None or current.resource_version != read.resource_version):
            raise Conflict(
                f'Operation cannot be fulfilled on configmaps "{name}": the object has been modified'
            )
        kept = labels if labels is not None else (current.labels if current else {})
        return self._store_config_map(namespace, name, data, kept)

    def _store_config_map(
        self, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str]
    ) -> ConfigMap:
        self._revision += 1
        stored = ConfigMap(namespace, name, dict(data), dict(labels), str(self._revision))
        self._config_maps[(namespace, name)] = stored
        return stored

    def _put(self, kind: str, key: str, obj: Any) -> Any:
        self._revision += 1
        stored = dataclasses.replace(obj, resource_version=str(self._revision))
        old = self._objects[kind].get(key)
        self._objects[kind][key] = stored
        self._record(
            _Change(self._revision, kind, EventType.MODIFIED if old else EventType.ADDED, stored, old)
        )
        return stored

    def _delete(self, kind: str, key: str) -> None:
        old = self._objects[kind].pop(key, None)
        if old is None:
            raise NotFound(f'{kind} "{key}" not found')
        self._revision += 1
        gone = dataclasses.replace(old, resource_version=str(self._revision))
        self._record(_Change(self._revision, kind, EventType.DELETED, gone, old))

    def _record(self, change: _Change) -> None:
        self._history.append(change)
        for watcher in self._watchers:
            if watcher.kind == change.kind:
                seen = change.seen_by(watcher.predicate)
                if seen is not None:
                    watcher.queue.put_nowait(seen)

    async def _watch(
        self, kind: str, resource_version: str, predicate: Callable[[Any], bool]
    ) -> AsyncIterator[Any]:
        try:
            since = int(resource_version)
        except ValueError:
            raise ValueError(f"resourceVersion: expected an integer, got {resource_version!r}") from None
        if since < self._compacted:
            raise WatchExpired(f"too old resource version: {since} ({self._compacted})")
        watcher = _Watcher(kind, predicate, asyncio.Queue())
        for change in self._history:
            if change.revision > since and change.kind == kind:
                seen = change.seen_by(predicate)
                if seen is not None:
                    watcher.queue.put_nowait(seen)
        self._watchers.append(watcher)
        try:
            while True:
                event = await watcher.queue.get()
                if event is None:
                    return
                yield event
        finally:
            self._watchers.remove(watcher)
