"""The StatefulSet controller (apps/v1), after kube-controller-manager's, in a small form.

Pods are `<statefulset>-<ordinal>` for ordinals 0..replicas-1, with the labels
`statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index` and `controller-revision-hash`,
and the StatefulSet's `serviceName` as their subdomain (hostname: the pod's name). With
`podManagementPolicy: OrderedReady` (the default) a pod is created only once every lower ordinal is
Running and Ready, and scaling down removes the highest ordinal first, one at a time; `Parallel`
creates and deletes them all at once. An ended pod is deleted and made again. A new template rolls
out (`RollingUpdate`) from the highest ordinal down, one pod at a time, once the others are ready.
Status: replicas, readyReplicas, availableReplicas, currentReplicas, updatedReplicas, the revisions
and observedGeneration.

Left out: ControllerRevision objects (the revision is the template's hash), volumeClaimTemplates,
partitions, `OnDelete`, `ordinals.start` and minReadySeconds.
"""

from __future__ import annotations

import copy
from typing import Any

from tessera.devcluster.apiserver.ownership import owner_reference
from tessera.devcluster.apiserver.resources import PODS, STATEFULSETS
from tessera.devcluster.controllers.base import (
    Controller,
    Mapper,
    ObjectKey,
    own_key,
    owner_key,
    pod_ready,
)
from tessera.devcluster.controllers.deployments import pod_template_hash

POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REVISION_LABEL = "controller-revision-hash"
COMPONENT = "statefulset-controller"
_ENDED = ("Succeeded", "Failed")


class StatefulSetController(Controller):
    name = COMPONENT

    def watches(self) -> list[tuple[Any, Mapper]]:
        return [(STATEFULSETS, self._statefulset_event), (PODS, owner_key("StatefulSet"))]

    def _statefulset_event(self, kind: str, statefulset: dict[str, Any]) -> list[ObjectKey]:
        return [] if kind == "DELETED" else own_key(kind, statefulset)

    async def reconcile(self, namespace: str, name: str) -> None:
        statefulset = self.ctx.store.find(STATEFULSETS, namespace, name)
        if statefulset is None or statefulset["metadata"].get("deletionTimestamp"):
            return
        spec = statefulset["spec"]
        revision = f"{name}-{pod_template_hash(spec['template'])}"
        replicas = int(spec.get("replicas", 1))
        ordered = spec.get("podManagementPolicy", "OrderedReady") != "Parallel"
        pods = self._pods(statefulset)

        for ordinal, pod in list(pods.items()):
            if (pod.get("status") or {}).get("phase") in _ENDED:
                self.ctx.delete(PODS, namespace, pod["metadata"]["name"])
                del pods[ordinal]

        for ordinal in range(replicas):
            if ordinal in pods:
                continue
            if ordered and not all(_running_ready(pods.get(lower)) for lower in range(ordinal)):
                break
            pods[ordinal] = await self.ctx.create_for(
                statefulset, PODS, namespace, pod_for(statefulset, ordinal, revision), COMPONENT
            )
            self.ctx.event(
                statefulset,
                "Normal",
                "SuccessfulCreate",
                f"create Pod {pods[ordinal]['metadata']['name']} in StatefulSet {name} successful",
                COMPONENT,
            )
            if ordered:
                break

        surplus = sorted((o for o in pods if o >= replicas), reverse=True)
        for ordinal in surplus[:1] if ordered else surplus:
            self._delete(statefulset, pods.pop(ordinal))

        if (spec.get("updateStrategy") or {}).get("type", "RollingUpdate") == "RollingUpdate":
            stale = sorted(
                (o for o, p in pods.items() if p["metadata"]["labels"].get(REVISION_LABEL) != revision),
                reverse=True,
            )
            if stale and all(_running_ready(p) for p in pods.values()):
                self._delete(statefulset, pods.pop(stale[0]))
        self._write_status(statefulset, revision)

    def _pods(self, statefulset: dict[str, Any]) -> dict[int, dict[str, Any]]:
        owned: dict[int, dict[str, Any]] = {}
        for pod in self.ctx.store.owned_by(statefulset["metadata"]["uid"], PODS, copy_objects=False):
            index = (pod["metadata"].get("labels") or {}).get(POD_INDEX_LABEL)
            if index and index.isdigit() and not pod["metadata"].get("deletionTimestamp"):
                owned[int(index)] = pod
        return owned

    def _delete(self, statefulset: dict[str, Any], pod: dict[str, Any]) -> None:
        if self.ctx.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"]):
            self.ctx.event(
                statefulset,
                "Normal",
                "SuccessfulDelete",
                f"delete Pod {pod['metadata']['name']} in StatefulSet "
                f"{statefulset['metadata']['name']} successful",
                COMPONENT,
            )

    def _write_status(self, statefulset: dict[str, Any], revision: str) -> None:
        pods = list(self._pods(statefulset).values())
        ready = sum(1 for p in pods if pod_ready(p))
        updated = sum(1 for p in pods if p["metadata"]["labels"].get(REVISION_LABEL) == revision)

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status.update(
                observedGeneration=obj["metadata"].get("generation", 1),
                replicas=len(pods),
                readyReplicas=ready,
                availableReplicas=ready,
                currentReplicas=updated,
                updatedReplicas=updated,
                currentRevision=revision if updated == len(pods) else status.get("currentRevision", revision),
                updateRevision=revision,
                collisionCount=0,
            )

        meta = statefulset["metadata"]
        self.ctx.store.mutate(STATEFULSETS, meta["namespace"], meta["name"], change)


def _running_ready(pod: dict[str, Any] | None) -> bool:
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running" and pod_ready(pod)


def pod_for(statefulset: dict[str, Any], ordinal: int, revision: str) -> dict[str, Any]:
    meta, spec = statefulset["metadata"], statefulset["spec"]
    template = copy.deepcopy(spec["template"])
    name = f"{meta['name']}-{ordinal}"
    labels = {
        **((template.get("metadata") or {}).get("labels") or {}),
        POD_NAME_LABEL: name,
        POD_INDEX_LABEL: str(ordinal),
        REVISION_LABEL: revision,
    }
    pod_spec = template.get("spec") or {}
    pod_spec["hostname"] = name
    if spec.get("serviceName"):
        pod_spec["subdomain"] = spec["serviceName"]
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": meta["namespace"],
        "labels": labels,
        "ownerReferences": [owner_reference(statefulset)],
    }
    annotations = (template.get("metadata") or {}).get("annotations")
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
