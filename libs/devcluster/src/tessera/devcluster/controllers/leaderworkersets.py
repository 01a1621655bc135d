"""The LeaderWorkerSet controller (leaderworkerset.x-k8s.io/v1), after kubernetes-sigs/lws's.

- A LeaderWorkerSet `<lws>` of `spec.replicas` groups of `leaderWorkerTemplate.size` pods is a
  leader StatefulSet `<lws>` (owned by it, `podManagementPolicy: Parallel`) of one leader pod per
  group, `<lws>-<group>`, from `leaderTemplate` (or `workerTemplate` when it has none), and per
  leader pod a worker StatefulSet named as the leader pod and owned by it, of `size - 1` pods
  `<lws>-<group>-<1..size-1>` from `workerTemplate`. A headless Service `<lws>` selects them all.
- Pods carry the labels `leaderworkerset.sigs.k8s.io/name`, `group-index`, `group-key` (the sha1 of
  the leader pod's `namespace/name`), `worker-index` (0 for the leader) and `template-revision-hash`,
  the annotations `size` and (workers) `leader-name`, and the env `LWS_LEADER_ADDRESS`,
  `LWS_GROUP_SIZE` and `LWS_WORKER_INDEX`, as upstream's pod webhook sets them at creation; here
  `LwsPodDefaults` does it on the controllers' creates. It also gives worker pods their upstream
  names (the worker StatefulSet's `ordinals.start: 1`; the devcluster's StatefulSet controller counts
  its ordinals from 0, and keeps its own `apps.kubernetes.io/pod-index` label).
- `restartPolicy: RecreateGroupOnPodRestart` (the default): a pod of a group that ended, or whose
  container restarted, deletes the group's leader pod, and the whole group is made again; `None`
  leaves it to the StatefulSets.
- A worker StatefulSet whose leader pod is gone is deleted (the garbage collector's work: the
  devcluster's collector does not watch pods as owners).
- Status: `replicas` (groups with a leader pod), `readyReplicas` (groups whose pods are all ready),
  `updatedReplicas`, `hpaPodSelector`, and the conditions `Available` and `Progressing`.

Left out: rolling updates of the templates (a new template applies to groups made after it),
`startupPolicy: LeaderReady` (workers are made with their leader), subgroups, exclusive topology,
network configuration and `rolloutStrategy`.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from tessera.devcluster.apiserver.ownership import owner_reference
from tessera.devcluster.apiserver.resources import (
    LEADERWORKERSETS,
    PODS,
    SERVICES,
    STATEFULSETS,
    ResourceType,
)
from tessera.devcluster.apiserver.selectors import Selector
from tessera.devcluster.controllers.base import (
    Controller,
    ControllerContext,
    Mapper,
    ObjectKey,
    own_key,
    pod_ready,
    set_condition,
)
from tessera.devcluster.controllers.statefulsets import POD_INDEX_LABEL, POD_NAME_LABEL

PREFIX = "leaderworkerset.sigs.k8s.io/"
NAME_LABEL = f"{PREFIX}name"
GROUP_INDEX_LABEL = f"{PREFIX}group-index"
GROUP_KEY_LABEL = f"{PREFIX}group-key"
WORKER_INDEX_LABEL = f"{PREFIX}worker-index"
REVISION_LABEL = f"{PREFIX}template-revision-hash"
SIZE_ANNOTATION = f"{PREFIX}size"
LEADER_NAME_ANNOTATION = f"{PREFIX}leader-name"
COMPONENT = "lws-controller"
RECREATE_GROUP = "RecreateGroupOnPodRestart"


def size_of(lws: dict[str, Any]) -> int:
    return int((lws["spec"].get("leaderWorkerTemplate") or {}).get("size", 1) or 1)


def group_key(namespace: str, leader: str) -> str:
    return hashlib.sha1(f"{namespace}/{leader}".encode()).hexdigest()


def templates(lws: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The leader's and the workers' pod templates."""
    lwt = lws["spec"].get("leaderWorkerTemplate") or {}
    worker = lwt.get("workerTemplate") or {}
    return copy.deepcopy(lwt.get("leaderTemplate") or worker), copy.deepcopy(worker)


def revision_of(lws: dict[str, Any]) -> str:
    lwt = lws["spec"].get("leaderWorkerTemplate") or {}
    return hashlib.sha256(json.dumps(lwt, sort_keys=True).encode()).hexdigest()[:10]


class LeaderWorkerSetController(Controller):
    name = COMPONENT

    def watches(self) -> list[tuple[Any, Mapper]]:
        return [
            (LEADERWORKERSETS, self._lws_event),
            (STATEFULSETS, _by_name_label),
            (PODS, _by_name_label),
        ]

    def _lws_event(self, kind: str, lws: dict[str, Any]) -> list[ObjectKey]:
        return [] if kind == "DELETED" else own_key(kind, lws)

    async def reconcile(self, namespace: str, name: str) -> None:
        lws = self.ctx.store.find(LEADERWORKERSETS, namespace, name)
        if lws is None or lws["metadata"].get("deletionTimestamp"):
            return
        revision = revision_of(lws)
        self._ensure_service(lws)
        leaders_sts = await self._ensure_leader_statefulset(lws, revision)
        leaders = [
            p
            for p in self.ctx.store.owned_by(leaders_sts["metadata"]["uid"], PODS, copy_objects=False)
            if not p["metadata"].get("deletionTimestamp")
        ]
        workers = self._worker_statefulsets(lws)
        size = size_of(lws)
        recreate = lws["spec"].get("leaderWorkerTemplate", {}).get("restartPolicy", RECREATE_GROUP)
        live_uids = {p["metadata"]["uid"] for p in leaders}
        for sts in workers:
            if _owner_uid(sts) not in live_uids:
                self.ctx.delete(STATEFULSETS, namespace, sts["metadata"]["name"])
        by_leader = {_owner_uid(s): s for s in workers}
        for leader in leaders:
            group_pods = [leader, *self._worker_pods(by_leader.get(leader["metadata"]["uid"]))]
            if recreate == RECREATE_GROUP and any(_restarted(p) for p in group_pods):
                self.ctx.delete(PODS, namespace, leader["metadata"]["name"])
                self.ctx.event(
                    lws,
                    "Normal",
                    "RecreateGroupOnPodRestart",
                    f"Worker pod of group {leader['metadata']['labels'].get(GROUP_INDEX_LABEL)} restarted: "
                    f"deleting leader pod {leader['metadata']['name']} to recreate the group",
                    COMPONENT,
                )
                continue
            if size > 1 and leader["metadata"]["uid"] not in by_leader:
                body = worker_statefulset(lws, leader, revision)
                await self.ctx.create_for(lws, STATEFULSETS, namespace, body, COMPONENT)
        self._write_status(lws, revision)

    def _ensure_service(self, lws: dict[str, Any]) -> None:
        namespace, name = lws["metadata"]["namespace"], lws["metadata"]["name"]
        if self.ctx.store.find(SERVICES, namespace, name) is not None:
            return
        self.ctx.store.create(
            SERVICES,
            namespace,
            {
                "metadata": {"name": name, "ownerReferences": [owner_reference(lws)]},
                "spec": {
                    "clusterIP": "None",
                    "selector": {NAME_LABEL: name},
                    "publishNotReadyAddresses": True,
                },
            },
        )

    async def _ensure_leader_statefulset(self, lws: dict[str, Any], revision: str) -> dict[str, Any]:
        namespace, name = lws["metadata"]["namespace"], lws["metadata"]["name"]
        replicas = int(lws["spec"].get("replicas", 1))
        current = self.ctx.store.find(STATEFULSETS, namespace, name)
        if current is None:
            return await self.ctx.create_for(
                lws, STATEFULSETS, namespace, leader_statefulset(lws, revision), COMPONENT
            )
        if int(current["spec"].get("replicas", 1)) != replicas:

            def scale(obj: dict[str, Any]) -> None:
                obj["spec"]["replicas"] = replicas

            return self.ctx.store.mutate(STATEFULSETS, namespace, name, scale)
        return current

    def _worker_statefulsets(self, lws: dict[str, Any]) -> list[dict[str, Any]]:
        selector = Selector.parse(f"{NAME_LABEL}={lws['metadata']['name']}", None)
        items, _ = self.ctx.store.list(STATEFULSETS, lws["metadata"]["namespace"], selector)
        return [s for s in items if _owner_kind(s) == "Pod"]

    def _worker_pods(self, sts: dict[str, Any] | None) -> list[dict[str, Any]]:
        if sts is None:
            return []
        return [
            p
            for p in self.ctx.store.owned_by(sts["metadata"]["uid"], PODS, copy_objects=False)
            if not p["metadata"].get("deletionTimestamp")
        ]

    def _write_status(self, lws: dict[str, Any], revision: str) -> None:
        namespace, name = lws["metadata"]["namespace"], lws["metadata"]["name"]
        wanted = int(lws["spec"].get("replicas", 1))
        size = size_of(lws)
        pods, _ = self.ctx.store.list(PODS, namespace, Selector.parse(f"{NAME_LABEL}={name}", None))
        groups: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            if not pod["metadata"].get("deletionTimestamp"):
                groups.setdefault(pod["metadata"]["labels"].get(GROUP_INDEX_LABEL, ""), []).append(pod)
        created = sum(1 for members in groups.values() if any(_worker_index(p) == "0" for p in members))
        ready = sum(
            1 for members in groups.values() if len(members) >= size and all(pod_ready(p) for p in members)
        )
        updated = sum(
            1
            for members in groups.values()
            if any(
                _worker_index(p) == "0" and p["metadata"]["labels"].get(REVISION_LABEL) == revision
                for p in members
            )
        )
        available = ready >= wanted

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status.update(
                observedGeneration=obj["metadata"].get("generation", 1),
                replicas=created,
                readyReplicas=ready,
                updatedReplicas=updated,
                hpaPodSelector=f"{NAME_LABEL}={name},{WORKER_INDEX_LABEL}=0",
            )
            if available:
                set_condition(
                    status, "Available", "True", "AllGroupsReady", "All replicas are ready", probe=False
                )
                set_condition(
                    status, "Progressing", "False", "GroupsReady", "All groups are ready", probe=False
                )
            else:
                set_condition(
                    status,
                    "Available",
                    "False",
                    "GroupsNotReady",
                    f"{ready} of {wanted} groups ready",
                    probe=False,
                )
                set_condition(
                    status,
                    "Progressing",
                    "True",
                    "GroupsProgressing",
                    "Replicas are progressing",
                    probe=False,
                )

        before = lws.get("status") or {}
        written = self.ctx.store.mutate(LEADERWORKERSETS, namespace, name, change)
        was_available = any(
            c.get("type") == "Available" and c.get("status") == "True" for c in before.get("conditions") or []
        )
        if available and not was_available:
            self.ctx.event(written, "Normal", "AllGroupsReady", "All replicas are ready", COMPONENT)


def _by_name_label(kind: str, obj: dict[str, Any]) -> list[ObjectKey]:
    meta = obj.get("metadata") or {}
    lws = (meta.get("labels") or {}).get(NAME_LABEL)
    return [(str(meta.get("namespace") or ""), str(lws))] if lws else []


def _owner_uid(obj: dict[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("uid"))
    return None


def _owner_kind(obj: dict[str, Any]) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind"))
    return None


def _worker_index(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("labels") or {}).get(WORKER_INDEX_LABEL)


def _restarted(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return any(int(c.get("restartCount", 0) or 0) > 0 for c in status.get("containerStatuses") or [])


def _statefulset(
    lws: dict[str, Any],
    name: str,
    owner: dict[str, Any],
    replicas: int,
    template: dict[str, Any],
    labels: dict[str, str],
    annotations: dict[str, str],
) -> dict[str, Any]:
    meta = template.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **labels}
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    selector = {k: v for k, v in labels.items() if k != REVISION_LABEL}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": lws["metadata"]["namespace"],
            "labels": dict(labels),
            "annotations": dict(annotations),
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "replicas": replicas,
            "serviceName": lws["metadata"]["name"],
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector},
            "template": template,
        },
    }


def leader_statefulset(lws: dict[str, Any], revision: str) -> dict[str, Any]:
    name = lws["metadata"]["name"]
    labels = {NAME_LABEL: name, WORKER_INDEX_LABEL: "0", REVISION_LABEL: revision}
    annotations = {SIZE_ANNOTATION: str(size_of(lws))}
    leader, _ = templates(lws)
    return _statefulset(lws, name, lws, int(lws["spec"].get("replicas", 1)), leader, labels, annotations)


def worker_statefulset(lws: dict[str, Any], leader: dict[str, Any], revision: str) -> dict[str, Any]:
    leader_labels = leader["metadata"].get("labels") or {}
    labels = {
        NAME_LABEL: lws["metadata"]["name"],
        GROUP_INDEX_LABEL: str(leader_labels.get(GROUP_INDEX_LABEL, "")),
        GROUP_KEY_LABEL: str(leader_labels.get(GROUP_KEY_LABEL, "")),
        REVISION_LABEL: revision,
    }
    annotations = {SIZE_ANNOTATION: str(size_of(lws)), LEADER_NAME_ANNOTATION: leader["metadata"]["name"]}
    _, worker = templates(lws)
    name = leader["metadata"]["name"]
    return _statefulset(lws, name, leader, size_of(lws) - 1, worker, labels, annotations)


def lws_pod_defaults(pod: dict[str, Any]) -> dict[str, Any]:
    """What upstream's pod webhook sets on a LeaderWorkerSet's pod at creation (see the module)."""
    meta = pod["metadata"]
    labels = meta.setdefault("labels", {})
    lws = labels.get(NAME_LABEL)
    if not lws or POD_INDEX_LABEL not in labels:
        return pod
    ordinal = int(labels[POD_INDEX_LABEL])
    annotations = meta.get("annotations") or {}
    namespace = meta["namespace"]
    size = annotations.get(SIZE_ANNOTATION, "1")
    if labels.get(WORKER_INDEX_LABEL) == "0":  # a leader pod
        leader = meta["name"]
        labels[GROUP_INDEX_LABEL] = str(ordinal)
        labels[GROUP_KEY_LABEL] = group_key(namespace, leader)
        worker_index = 0
    else:
        leader = str(annotations.get(LEADER_NAME_ANNOTATION, ""))
        worker_index = ordinal + 1  # ordinals.start: 1
        meta["name"] = f"{leader}-{worker_index}"
        labels[POD_NAME_LABEL] = meta["name"]
        labels[WORKER_INDEX_LABEL] = str(worker_index)
        pod["spec"]["hostname"] = meta["name"]
    env = [
        {"name": "LWS_LEADER_ADDRESS", "value": f"{leader}.{lws}.{namespace}"},
        {"name": "LWS_GROUP_SIZE", "value": str(size)},
        {"name": "LWS_WORKER_INDEX", "value": str(worker_index)},
    ]
    for container in pod["spec"].get("containers") or []:
        names = {e.get("name") for e in container.get("env") or []}
        container["env"] = [*(container.get("env") or []), *(e for e in env if e["name"] not in names)]
    return pod


class LwsControllerContext(ControllerContext):
    """The controllers' context, with LeaderWorkerSet pods defaulted as upstream's pod webhook does,
    before the registered mutating webhooks see them."""

    async def create(self, resource: ResourceType, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if resource == PODS and NAME_LABEL in ((body.get("metadata") or {}).get("labels") or {}):
            body = lws_pod_defaults(body)
        return await super().create(resource, namespace, body)


__all__ = [
    "GROUP_INDEX_LABEL",
    "GROUP_KEY_LABEL",
    "NAME_LABEL",
    "WORKER_INDEX_LABEL",
    "LeaderWorkerSetController",
    "LwsControllerContext",
]
