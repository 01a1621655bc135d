"""Settings of the admission service: env prefix `TESSERA_ADMISSION_`."""

from __future__ import annotations

from enum import StrEnum
from functools import lru_cache

from pydantic import Field, SecretStr

from tessera.core.settings import ServiceSettings, http_port, service_config


class AuthMode(StrEnum):
    REQUIRED = "required"
    """Every /v1 request needs a bearer token: a tenant's token or the admin token."""
    DISABLED = "disabled"
    """No tokens; every caller acts as the admin (the embedded development stack)."""


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


@lru_cache
def get_settings() -> AdmissionSettings:
    return AdmissionSettings()
