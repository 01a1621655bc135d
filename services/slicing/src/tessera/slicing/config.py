"""Settings of the slicing service: env prefix `TESSERA_SLICING_`."""

from __future__ import annotations

from functools import lru_cache

from tessera.core.recording.wiring import observed_retention_h
from tessera.core.settings import ServiceSettings, http_port, service_config


class SlicingSettings(ServiceSettings):
    model_config = service_config("slicing")

    http_port: int = http_port(8084)
    # few events, kept a week for audits
    observed_retention_h: float = observed_retention_h(168.0)


@lru_cache
def get_settings() -> SlicingSettings:
    return SlicingSettings()
