"""Settings of the scheduler service: env prefix `TESSERA_SCHEDULER_`."""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import SettingsConfigDict

from tessera.core.settings import ServiceSettings


class SchedulerSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TESSERA_SCHEDULER_", env_nested_delimiter="__", extra="ignore"
    )

    http_port: int = 8083


@lru_cache
def get_settings() -> SchedulerSettings:
    return SchedulerSettings()
