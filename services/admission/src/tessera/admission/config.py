"""Settings of the admission service: env prefix `TESSERA_ADMISSION_`."""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import ClassVar

from pydantic import AliasChoices, Field, SecretStr

from tessera.core.settings import HttpsServing, ServiceSettings, http_port, service_config


class AuthMode(StrEnum):
    REQUIRED = "required"
    """Every /v1 request needs a bearer token: a tenant's token or the admin token."""
    DISABLED = "disabled"
    """No tokens; every caller acts as the admin (the embedded development stack)."""


class WebhookSettings(HttpsServing):
    """The mutating webhook over HTTPS, as a Kubernetes API server calls it. Without a certificate
    the webhook is served only on the plain HTTP port (`tessera up`, where the API server is on
    loopback)."""

    section: ClassVar[str] = "webhook"
    port: int = Field(9443, ge=0, le=65535, description="the HTTPS port of the webhook (with a certificate)")


class AdmissionSettings(ServiceSettings):
    model_config = service_config("admission")

    http_port: int = http_port(8080)
    cycle_interval_s: float = Field(0.2, gt=0, description="seconds between checks for changes when idle")
    full_cycle_interval_s: float = Field(10.0, gt=0, description="a cycle runs at least this often")
    auth: AuthMode = Field(
        AuthMode.REQUIRED,
        description="`required` (the default): bearer tokens per tenant; `disabled` only for a local stack",
    )
    admin_token: SecretStr | None = Field(None, description="the admin bearer token (when auth is required)")
    kubeconfig: Path | None = Field(
        None,
        validation_alias=AliasChoices("TESSERA_ADMISSION_KUBECONFIG", "TESSERA_KUBECONFIG", "kubeconfig"),
        description="a kubeconfig of the cluster that runs jobs: each job becomes suspended Indexed "
        "Jobs and a headless Service there, unsuspended when admitted (every pod group then needs a "
        "template); none: admission only queues",
    )
    namespace: str = Field(
        "default", min_length=1, description="where the objects of submitted jobs are made"
    )
    workload_sync_interval_s: float = Field(
        0.5, gt=0, description="seconds between rounds that bring jobs' objects to their state"
    )
    reconcile_grace_s: float = Field(
        60.0,
        ge=0,
        description="reconciliation leaves a job that changed more recently than this to its events, "
        "which may still be on their way",
    )
    webhook: WebhookSettings = WebhookSettings()


@lru_cache
def get_settings() -> AdmissionSettings:
    return AdmissionSettings()
