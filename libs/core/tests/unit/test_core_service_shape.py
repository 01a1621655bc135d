"""The pieces every service shares: settings base, consumer settings, waiting, retention rules."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from sqlalchemy import Column, DateTime, Integer, MetaData, Table

from tessera.core.db.retention import RetentionRule
from tessera.core.messaging.consumer import ConsumerSpec
from tessera.core.settings import ConsumerSettings, ServiceSettings, http_port, service_config
from tessera.core.waits import wait_any


class ExampleSettings(ServiceSettings):
    model_config = service_config("example")
    http_port: int = http_port(8099)


def test_a_service_reads_its_own_prefix_and_the_shared_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TESSERA_EXAMPLE_HTTP_PORT", "9001")
    monkeypatch.setenv("TESSERA_EXAMPLE_CONSUMER__BATCH", "7")
    monkeypatch.setenv("TESSERA_NATS_URL", "nats://elsewhere:4222")
    settings = ExampleSettings()
    assert (settings.http_port, settings.consumer.batch, settings.nats_url) == (
        9001,
        7,
        "nats://elsewhere:4222",
    )


def test_the_default_port_is_the_service_s_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_EXAMPLE_HTTP_PORT", raising=False)
    assert ExampleSettings().http_port == 8099


@pytest.mark.parametrize("port", [-1, 65536])
def test_the_port_check_names_the_field(port: int) -> None:
    with pytest.raises(ValidationError, match="http_port"):
        ExampleSettings(http_port=port)


def test_inbox_retention_must_outlive_the_duplicate_window() -> None:
    with pytest.raises(ValidationError, match=r"retention\.inbox_s"):
        ExampleSettings.model_validate({"retention": {"inbox_s": 60}, "stream": {"duplicate_window_s": 120}})


async def _handler(*_: object) -> None:
    return None


def test_the_runner_applies_the_service_s_consumer_settings_unless_the_spec_overrides_them() -> None:
    service_wide = ConsumerSettings(max_deliver=9, batch=32)
    plain = ConsumerSpec("c", "admission", "s", _handler).configured(service_wide)
    own = ConsumerSpec("c", "admission", "s", _handler, ConsumerSettings(batch=256)).configured(service_wide)
    assert (plain.max_deliver, plain.batch) == (9, 32)
    assert (own.max_deliver, own.batch) == (5, 256)


async def test_wait_any_returns_when_one_event_is_set() -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_soon(wake.set)
    assert await wait_any(stop, wake, timeout=30) is True
    assert not stop.is_set()


async def test_wait_any_times_out_when_nothing_is_set() -> None:
    assert await wait_any(asyncio.Event(), timeout=0.01) is False


async def test_wait_any_leaves_no_waiter_behind() -> None:
    before = len(asyncio.all_tasks())
    await wait_any(asyncio.Event(), asyncio.Event(), timeout=0.01)
    assert len(asyncio.all_tasks()) == before


def test_a_retention_rule_names_a_real_timestamp_column() -> None:
    table = Table("t", MetaData(), Column("id", Integer, primary_key=True), Column("at", DateTime))
    assert RetentionRule(table, "at", 60).name == "t"
    with pytest.raises(ValueError, match="no column 'when'"):
        RetentionRule(table, "when", 60)
    with pytest.raises(ValueError, match="positive"):
        RetentionRule(table, "at", 0)
