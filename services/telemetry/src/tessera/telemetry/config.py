"""Settings of the telemetry service: env prefix `TESSERA_TELEMETRY_`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from tessera.core.settings import ServiceSettings, StreamSettings


class TelemetrySettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="TESSERA_TELEMETRY_", env_nested_delimiter="__", extra="ignore"
    )

    http_port: int = 8081
    cluster_file: Path | None = Field(
        None, description="a YAML cluster file: the inventory of the embedded stack"
    )
    sample_interval_s: float = Field(10.0, gt=0)
    inventory_interval_s: float = Field(15.0, gt=0)
    inventory_republish_s: float = Field(600.0, gt=0)
    # Samples are many and short-lived.
    stream: StreamSettings = StreamSettings(max_age_s=3600.0)


@lru_cache
def get_settings() -> TelemetrySettings:
    return TelemetrySettings()
