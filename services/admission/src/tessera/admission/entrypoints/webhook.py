"""The mutating admission webhook the Kubernetes API server calls on CREATE of labelled workloads
(see `domain.webhook`). It is not behind admission's bearer tokens: the API server calls it, over
TLS with the CA bundle of the MutatingWebhookConfiguration in a real cluster, over loopback HTTP on
the devcluster."""

from __future__ import annotations

import logging
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body

from tessera.admission.domain.webhook import mutate, review_response

log = logging.getLogger(__name__)

router = APIRouter(tags=["webhook"])
MUTATE_PATH = "/webhooks/mutate"


@router.post(MUTATE_PATH)
async def mutate_workload(
    review: Annotated[dict[str, Any], Body(description="an admission.k8s.io/v1 AdmissionReview")],
) -> dict[str, Any]:
    """Hold a Job labelled `tessera.io/queue` (`suspend: true`, `schedulerName: tessera` on its pods)
    or JobSet (`suspend: true`, its pods one gang), or a labelled Pod (the scheduling gate
    `tessera.io/admission`)."""
    request = review.get("request") or {}
    kind = str((request.get("kind") or {}).get("kind", ""))
    obj = request.get("object") or {}
    mutation = mutate(kind, obj, str(uuid.uuid4()))
    meta = obj.get("metadata") or {}
    log.info(
        "webhook: %s",
        mutation.reason,
        extra={"kind": kind, "namespace": request.get("namespace"), "object": meta.get("name")},
    )
    return review_response(review, mutation)


WEBHOOK_CONFIGURATION = "tessera-admission"


def webhook_configuration(base_url: str, ca_bundle: str | None = None) -> dict[str, Any]:
    """The MutatingWebhookConfiguration that sends labelled Jobs, JobSets, LeaderWorkerSets and Pods to
    admission's webhook at ``base_url`` (Jobs and JobSets are held suspended, Pods gated, a
    LeaderWorkerSet's pod templates labelled so its pods come gated): only objects
    carrying `tessera.io/queue` (an unlabelled workload is never sent),
    `failurePolicy: Fail` (a labelled workload is refused rather than run unqueued)."""
    client: dict[str, Any] = {"url": base_url.rstrip("/") + MUTATE_PATH}
    if ca_bundle:
        client["caBundle"] = ca_bundle

    def rule(group: str, version: str, resource: str) -> dict[str, Any]:
        return {
            "apiGroups": [group],
            "apiVersions": [version],
            "operations": ["CREATE"],
            "resources": [resource],
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION},
        "webhooks": [
            {
                "name": "workloads.admission.tessera.io",
                "clientConfig": client,
                "rules": [
                    rule("batch", "v1", "jobs"),
                    rule("jobset.x-k8s.io", "v1alpha2", "jobsets"),
                    rule("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
                    rule("", "v1", "pods"),
                ],
                "objectSelector": {"matchExpressions": [{"key": "tessera.io/queue", "operator": "Exists"}]},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 10,
            }
        ],
    }
