"""`tessera up` registers admission's mutating webhook with the devcluster, so that `kubectl apply`
of a workload labelled `tessera.io/queue` is held for admission (loopback HTTP; a real cluster gets
the configuration with TLS and a CA bundle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tessera.admission.entrypoints.webhook import WEBHOOK_CONFIGURATION, webhook_configuration
from tessera.cluster.kube import api_client


def register_webhook(kubeconfig: Path, admission_url: str) -> None:
    """Create admission's MutatingWebhookConfiguration, or replace the one a previous run left."""
    body = webhook_configuration(admission_url)
    api = api_client(kubeconfig=str(kubeconfig))
    try:
        hooks: Any = k8s.AdmissionregistrationV1Api(api)
        try:
            hooks.create_mutating_webhook_configuration(body)
        except ApiException as error:
            if error.status != 409:
                raise
            current = hooks.read_mutating_webhook_configuration(WEBHOOK_CONFIGURATION)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            hooks.replace_mutating_webhook_configuration(WEBHOOK_CONFIGURATION, body)
    finally:
        api.close()  # type: ignore[no-untyped-call]
