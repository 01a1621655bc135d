"""Settings: shared ones (`TESSERA_NATS_URL`, `TESSERA_DATABASE_URL`) and per service (`TESSERA_<SERVICE>_*`)."""

from __future__ import annotations

from typing import Any, Self

from pydantic import AliasChoices, BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tessera.core.messaging.streams import StreamLimits


class StreamSettings(BaseModel):
    duplicate_window_s: float = Field(120.0, gt=0)
    max_age_s: float = Field(7 * 24 * 3600.0, gt=0)
    max_bytes: int = Field(1024**3, gt=0)
    replicas: int = Field(1, ge=1, le=5)

    def limits(self) -> StreamLimits:
        return StreamLimits(self.duplicate_window_s, self.max_age_s, self.max_bytes, self.replicas)


class ConsumerSettings(BaseModel):
    max_deliver: int = Field(5, ge=1)
    ack_wait_s: float = Field(30.0, gt=0)
    batch: int = Field(64, ge=1, le=1024)
    backoff_base_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)


class RetentionSettings(BaseModel):
    """How long handled-message records are kept; services add their own tables (raw samples, say)."""

    interval_s: float = Field(60.0, gt=0, description="how often old rows are deleted")
    inbox_s: float = Field(
        900.0, gt=0, description="inbox rows older than this are deleted; must exceed the duplicate window"
    )


class ServiceSettings(BaseSettings):
    """A service's settings subclass this with two lines:

    ```
    class CheckpointSettings(ServiceSettings):
        model_config = service_config("checkpoint")
        http_port: int = http_port(8085)
    ```
    """

    model_config = SettingsConfigDict(
        env_prefix="TESSERA_", env_nested_delimiter="__", extra="ignore", populate_by_name=True
    )

    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias=AliasChoices("TESSERA_NATS_URL"))
    database_url: SecretStr = Field(
        SecretStr("postgresql://postgres@127.0.0.1:5432/tessera"),
        validation_alias=AliasChoices("TESSERA_DATABASE_URL"),
    )
    http_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=0, le=65535)
    log_level: str = "INFO"
    db_pool_size: int = Field(5, ge=1)
    stream: StreamSettings = StreamSettings()
    consumer: ConsumerSettings = ConsumerSettings()
    outbox_poll_s: float = Field(0.5, gt=0)
    shutdown_grace_s: float = Field(10.0, gt=0)
    retention: RetentionSettings = RetentionSettings()

    @model_validator(mode="after")
    def _inbox_outlives_duplicate_window(self) -> Self:
        # A redelivery or a republish inside the window must still find its inbox row.
        if self.retention.inbox_s <= self.stream.duplicate_window_s:
            raise ValueError(
                f"retention.inbox_s ({self.retention.inbox_s:g}) must exceed "
                f"stream.duplicate_window_s ({self.stream.duplicate_window_s:g})"
            )
        return self


def service_config(service: str) -> SettingsConfigDict:
    """Settings of `service` come from `TESSERA_<SERVICE>_*`, nested groups split by `__`."""
    return SettingsConfigDict(
        env_prefix=f"TESSERA_{service.upper()}_",
        env_nested_delimiter="__",
        extra="ignore",
        populate_by_name=True,
    )


def http_port(default: int) -> Any:
    """The service's default HTTP port, with the range check every service keeps."""
    return Field(default, ge=0, le=65535)
