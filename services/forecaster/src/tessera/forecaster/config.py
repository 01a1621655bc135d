"""Settings of the forecaster service: env prefix `TESSERA_FORECASTER_`."""

from __future__ import annotations

from functools import lru_cache

from tessera.core.settings import ServiceSettings, http_port, service_config


class ForecasterSettings(ServiceSettings):
    model_config = service_config("forecaster")

    http_port: int = http_port(8082)


@lru_cache
def get_settings() -> ForecasterSettings:
    return ForecasterSettings()
