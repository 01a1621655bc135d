"""Settings of the forecaster service: env prefix `TESSERA_FORECASTER_`."""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import SettingsConfigDict

from tessera.core.settings import ServiceSettings


class ForecasterSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TESSERA_FORECASTER_", env_nested_delimiter="__", extra="ignore"
    )

    http_port: int = 8082


@lru_cache
def get_settings() -> ForecasterSettings:
    return ForecasterSettings()
