"""Settings of the checkpoint service: env prefix `TESSERA_CHECKPOINT_`."""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import SettingsConfigDict

from tessera.core.settings import ServiceSettings


class CheckpointSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TESSERA_CHECKPOINT_", env_nested_delimiter="__", extra="ignore"
    )

    http_port: int = 8085


@lru_cache
def get_settings() -> CheckpointSettings:
    return CheckpointSettings()
