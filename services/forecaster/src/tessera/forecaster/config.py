"""Settings of the forecaster service: env prefix `TESSERA_FORECASTER_`."""

from __future__ import annotations

from functools import lru_cache

from tessera.core.recording.wiring import observed_retention_h
from tessera.core.settings import ServiceSettings, http_port, service_config


class ForecasterSettings(ServiceSettings):
    model_config = service_config("forecaster")

    http_port: int = http_port(8082)
    # a row for every GPU sample, every few seconds: a day of them, not all of them for ever
    observed_retention_h: float = observed_retention_h(24.0)


@lru_cache
def get_settings() -> ForecasterSettings:
    return ForecasterSettings()
