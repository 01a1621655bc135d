"""A stored configuration entry that a rule made since it was stored refuses (a tenant queue for the
reserved tenant name `unknown`) is left out of the configuration admission decides on, logged and
shown, instead of stopping every cycle, submission and configuration change for every tenant."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from tessera.admission.domain.documents import StoredConfig, TenantQueueDoc
from tessera.admission.domain.model import JobState
from tessera.admission.domain.queueing import QueueingValidationError
from tessera.admission.service_layer.configuration import change_config, skipped_log
from tessera.admission.service_layer.cycle import run_cycle
from tessera.admission.service_layer.handlers import submit_job
from tessera.testing.builders import a_job

CONFIG = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}],
}
STORED_BEFORE_THE_RULE = TenantQueueDoc(tenant="unknown", queue="team-q")


@pytest.fixture
def stale(uow: Any) -> Any:
    """A configuration holding a tenant queue for `unknown`, stored before the name was reserved."""
    uow.configure(CONFIG)
    stored = uow.fake_config.stored
    uow.fake_config.stored = dataclasses.replace(
        stored, tenant_queues=[*stored.tenant_queues, STORED_BEFORE_THE_RULE]
    )
    skipped_log._last.clear()
    return uow


def test_the_stale_entry_is_named_with_why_and_how_to_fix_it(stale: Any) -> None:
    stored: StoredConfig = stale.fake_config.stored
    with pytest.raises(QueueingValidationError):
        stored.build()  # the whole configuration, checked as a change is, still refuses it
    [entry] = stored.skipped()
    assert entry.field == "tenant_queues.unknown.tenant"
    assert "reserved for usage no job is known for" in entry.reason
    assert "DELETE /v1/tenant-queues/unknown" in entry.fix
    assert entry.entry == {"tenant": "unknown", "queue": "team-q"}
    assert stored.usable().build().tenant_queues == {"team": "team-q"}


async def test_other_tenants_submit_and_are_admitted(stale: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    async with stale:
        result = await submit_job(a_job("j1").tenant("team").group(gpus=2).as_dict(), stale, "j1")
        await stale.commit()
    assert result.state is JobState.QUEUED, result.errors
    async with stale:
        report = await run_cycle(stale)
    assert report.admitted == ["j1"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "stored configuration entry tenant_queues.unknown.tenant skipped: 'unknown' is reserved for usage "
        "no job is known for; delete it (DELETE /v1/tenant-queues/unknown) and map the tenant's jobs "
        "under another tenant name"
    ], "logged once, not on every cycle and submission"


async def test_other_changes_are_saved_and_the_stale_entry_can_only_go(stale: Any) -> None:
    def add_queue(cfg: StoredConfig) -> StoredConfig:
        return dataclasses.replace(
            cfg, tenant_queues=[*cfg.tenant_queues, TenantQueueDoc(tenant="b", queue="team-q")]
        )

    async with stale:
        await change_config(stale, add_queue)
    assert {tq.tenant for tq in stale.fake_config.stored.tenant_queues} == {"team", "unknown", "b"}

    def alter(cfg: StoredConfig) -> StoredConfig:
        kept = [tq for tq in cfg.tenant_queues if tq.tenant != "unknown"]
        return dataclasses.replace(
            cfg, tenant_queues=[*kept, TenantQueueDoc(tenant="unknown", queue="other")]
        )

    async with stale:
        with pytest.raises(QueueingValidationError) as caught:
            await change_config(stale, alter)
    assert caught.value.field == "tenant_queues.unknown.tenant"

    def delete(cfg: StoredConfig) -> StoredConfig:
        return dataclasses.replace(
            cfg, tenant_queues=[tq for tq in cfg.tenant_queues if tq.tenant != "unknown"]
        )

    async with stale:
        await change_config(stale, delete)
    assert stale.fake_config.stored.skipped() == []


async def test_a_new_entry_for_the_reserved_name_is_still_refused(uow: Any) -> None:
    uow.configure(CONFIG)

    def add(cfg: StoredConfig) -> StoredConfig:
        return dataclasses.replace(cfg, tenant_queues=[*cfg.tenant_queues, STORED_BEFORE_THE_RULE])

    async with uow:
        with pytest.raises(QueueingValidationError) as caught:
            await change_config(uow, add)
    assert (caught.value.field, caught.value.reason) == (
        "tenant_queues.unknown.tenant",
        "'unknown' is reserved for usage no job is known for",
    )
