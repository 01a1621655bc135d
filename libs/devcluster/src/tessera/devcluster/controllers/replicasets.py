"""The ReplicaSet controller (apps/v1), after kube-controller-manager's.

It keeps `spec.replicas` active pods (neither ended nor being deleted) that match its selector and
that it owns: it creates the missing ones from its template (`<replicaset>-<suffix>`) through the
mutating webhooks, and deletes the surplus, the least useful first (unbound, then pending, then not
ready, then the newest). An ended pod is replaced, as a pod of `restartPolicy: Always` would be.
Status: replicas, fullyLabeledReplicas, readyReplicas, availableReplicas (minReadySeconds is not
waited for) and observedGeneration.
"""

from __future__ import annotations

import copy
from typing import Any

from tessera.devcluster.apiserver.ownership import owner_reference
from tessera.devcluster.apiserver.resources import PODS, REPLICASETS
from tessera.devcluster.apiserver.selectors import LabelSelector, Selector
from tessera.devcluster.controllers.base import (
    Controller,
    Mapper,
    ObjectKey,
    own_key,
    owner_key,
    pod_active,
    pod_ready,
)

COMPONENT = "replicaset-controller"


class ReplicaSetController(Controller):
    name = COMPONENT

    def watches(self) -> list[tuple[Any, Mapper]]:
        return [(REPLICASETS, self._replicaset_event), (PODS, owner_key("ReplicaSet"))]

    def _replicaset_event(self, kind: str, replicaset: dict[str, Any]) -> list[ObjectKey]:
        return [] if kind == "DELETED" else own_key(kind, replicaset)

    async def reconcile(self, namespace: str, name: str) -> None:
        replicaset = self.ctx.store.find(REPLICASETS, namespace, name)
        if replicaset is None or replicaset["metadata"].get("deletionTimestamp"):
            return
        active = [p for p in self._pods(replicaset) if pod_active(p)]
        wanted = int(replicaset["spec"].get("replicas", 1))
        if len(active) < wanted:
            for _ in range(wanted - len(active)):
                created = await self.ctx.create_for(
                    replicaset, PODS, namespace, pod_from_template(replicaset), COMPONENT
                )
                self.ctx.event(
                    replicaset,
                    "Normal",
                    "SuccessfulCreate",
                    f"Created pod: {created['metadata']['name']}",
                    COMPONENT,
                )
        elif len(active) > wanted:
            for pod in sorted(active, key=_deletion_rank)[: len(active) - wanted]:
                if self.ctx.delete(PODS, namespace, pod["metadata"]["name"]):
                    self.ctx.event(
                        replicaset,
                        "Normal",
                        "SuccessfulDelete",
                        f"Deleted pod: {pod['metadata']['name']}",
                        COMPONENT,
                    )
        self._write_status(replicaset)

    def _pods(self, replicaset: dict[str, Any]) -> list[dict[str, Any]]:
        """The pods the ReplicaSet owns that its selector still matches."""
        match_labels = (replicaset["spec"].get("selector") or {}).get("matchLabels") or {}
        selector = Selector(LabelSelector.from_match_labels(match_labels))
        return [
            p
            for p in self.ctx.store.owned_by(replicaset["metadata"]["uid"], PODS, copy_objects=False)
            if selector.matches(p)
        ]

    def _write_status(self, replicaset: dict[str, Any]) -> None:
        active = [p for p in self._pods(replicaset) if pod_active(p)]
        ready = sum(1 for p in active if pod_ready(p))

        def change(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            status.update(
                replicas=len(active),
                fullyLabeledReplicas=len(active),
                readyReplicas=ready,
                availableReplicas=ready,
                observedGeneration=obj["metadata"].get("generation", 1),
            )

        meta = replicaset["metadata"]
        self.ctx.store.mutate(REPLICASETS, meta["namespace"], meta["name"], change)


def _deletion_rank(pod: dict[str, Any]) -> tuple[bool, bool, bool, str]:
    """Sorts the pods to delete first: unbound, pending, not ready, newest."""
    bound = bool((pod.get("spec") or {}).get("nodeName"))
    running = (pod.get("status") or {}).get("phase") == "Running"
    created = pod["metadata"].get("creationTimestamp", "")
    # newest first: invert the timestamp's order by negating each character's code
    return bound, running, pod_ready(pod), "".join(chr(0x10FFFF - ord(c)) for c in created)


def pod_from_template(replicaset: dict[str, Any]) -> dict[str, Any]:
    template = copy.deepcopy(replicaset["spec"].get("template") or {})
    meta = template.get("metadata") or {}
    metadata: dict[str, Any] = {
        "generateName": f"{replicaset['metadata']['name']}-",
        "namespace": replicaset["metadata"]["namespace"],
        "labels": dict(meta.get("labels") or {}),
        "ownerReferences": [owner_reference(replicaset)],
    }
    if meta.get("annotations"):
        metadata["annotations"] = dict(meta["annotations"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template.get("spec") or {}}
