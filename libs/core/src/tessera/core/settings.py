"""Settings: shared ones (`TESSERA_NATS_URL`, `TESSERA_DATABASE_URL`) and per service (`TESSERA_<SERVICE>_*`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import AliasChoices, BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tessera.core.messaging.streams import Discard, StreamLimits


class StreamSettings(BaseModel):
    """The service's stream. It keeps messages by limits (age, bytes), consumed or not, so `max_bytes`
    counts the history too: with `discard="new"` a stream that filled refuses every publish until
    old messages age out, and with `"old"` (the default) a full stream drops its oldest messages,
    even ones a consumer has not read yet. Size `max_bytes` for `max_age_s` of traffic either way."""

    duplicate_window_s: float = Field(120.0, gt=0)
    max_age_s: float = Field(7 * 24 * 3600.0, gt=0)
    max_bytes: int = Field(1024**3, gt=0)
    replicas: int = Field(1, ge=1, le=5)
    discard: Discard = Field(
        "old",
        description='what a full stream does with a new message: "old" drops its oldest messages '
        '(consumed or not), "new" refuses the message (the outbox then keeps the row until there is room)',
    )

    def limits(self) -> StreamLimits:
        return StreamLimits(
            self.duplicate_window_s, self.max_age_s, self.max_bytes, self.replicas, self.discard
        )


class ConsumerSettings(BaseModel):
    max_deliver: int = Field(5, ge=1)
    ack_wait_s: float = Field(30.0, gt=0)
    batch: int = Field(64, ge=1, le=1024)
    backoff_base_s: float = Field(0.5, gt=0)
    backoff_max_s: float = Field(30.0, gt=0)
    max_message_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="a message larger than this (headers included, and never above the server's "
        "max_payload) is dead-lettered at intake as too large",
    )


class RetentionSettings(BaseModel):
    """How long handled-message records are kept; services add their own tables (raw samples, say).

    The inbox drops a message whose id it holds, so exactly-once handling assumes every copy of an
    event reaches a consumer within `inbox_s` of the first: JetStream drops a republished copy only
    inside the stream's duplicate window (hence `inbox_s` must exceed it), and redeliveries come
    within `max_deliver` backoffs. A copy arriving later (published again by hand, or a durable
    consumer created anew reading the stream from its start) is handled again."""

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
    outbox_max_attempts: int = Field(
        5, ge=1, description="publishes an outbox row may fail by its own fault before it is dead-lettered"
    )
    nats_inbox_prefix: str | None = Field(
        None,
        description="prefix of this connection's reply subjects (nats.py's default `_INBOX` when unset); "
        "a NATS user allowed replies on its own prefix only must use that prefix",
    )
    nats_reconnect_wait_s: float = Field(
        1.0, gt=0, description="pause between reconnection attempts to NATS (which go on for ever)"
    )
    nats_ping_interval_s: float = Field(
        10.0, gt=0, description="how often the connection is pinged; two missed pongs mean it is dead"
    )
    shutdown_grace_s: float = Field(10.0, gt=0)
    max_request_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="a request body larger than this is answered 413"
    )
    liveness_exit_after_s: float = Field(
        30.0,
        ge=0,
        description="a service that stays not live this long (a task crashed, NATS closed for good) exits "
        "with code 70 so that its supervisor restarts it; 0 never exits (Kubernetes' probe restarts it)",
    )
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


class HttpsServing(BaseModel):
    """A second server over HTTPS (tessera.core.https): its certificate and key, both or neither, and
    how often renewed files are checked. A subclass adds its `port` and names its `section`."""

    section: ClassVar[str] = "https"

    cert_file: Path | None = Field(
        None, description="the serving certificate (PEM, its chain after it); with key_file: serve HTTPS"
    )
    key_file: Path | None = Field(None, description="the certificate's private key (PEM)")
    reload_interval_s: float = Field(
        60.0, gt=0, description="seconds between checks for a renewed certificate in the files"
    )

    @model_validator(mode="after")
    def _cert_and_key_together(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = ("cert_file", "key_file") if self.key_file is None else ("key_file", "cert_file")
            raise ValueError(
                f"{self.section}.{missing} is required with {self.section}.{given}: HTTPS needs both"
            )
        return self

    @property
    def tls(self) -> bool:
        return self.cert_file is not None
