"""Settings of the admission service: env prefix `TESSERA_ADMISSION_`."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from tessera.core.settings import ServiceSettings


class AdmissionSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TESSERA_ADMISSION_", env_nested_delimiter="__", extra="ignore"
    )

    http_port: int = 8080
    cycle_interval_s: float = Field(0.2, gt=0, description="seconds between admission cycles when idle")


@lru_cache
def get_settings() -> AdmissionSettings:
    return AdmissionSettings()
