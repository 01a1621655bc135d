"""Settings of the slicing service: env prefix `TESSERA_SLICING_`."""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import SettingsConfigDict

from tessera.core.settings import ServiceSettings


class SlicingSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TESSERA_SLICING_", env_nested_delimiter="__", extra="ignore"
    )

    http_port: int = 8084


@lru_cache
def get_settings() -> SlicingSettings:
    return SlicingSettings()
