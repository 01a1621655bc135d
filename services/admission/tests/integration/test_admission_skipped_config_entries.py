"""On Postgres, through the whole app: a tenant queue for `unknown` stored before the name was
reserved no longer stops admission for every tenant. The configuration is built without it, the
config API's status names it with how to fix it, other tenants' jobs are admitted, other changes
are saved, and deleting it clears the status."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tessera.core.db.engine import async_url
from tessera.testing.services import eventually

pytestmark = pytest.mark.integration

CONFIG = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "team-q", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
    "tenant_queues": [{"tenant": "team", "queue": "team-q"}],
}


async def store_before_the_rule(db: str) -> None:
    engine = create_async_engine(async_url(db))
    try:
        async with engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO admission.tenant_queues (tenant, queue) VALUES ('unknown', 'team-q')")
            )
    finally:
        await engine.dispose()


async def test_a_stale_reserved_tenant_queue_is_skipped_and_shown(api: Any) -> None:
    assert (await api.client.put("/v1/config", json=CONFIG)).status_code == 200
    assert (await api.client.get("/v1/config/status")).json() == {"skipped": []}
    await store_before_the_rule(api.db)

    status = (await api.client.get("/v1/config/status")).json()
    [entry] = status["skipped"]
    assert entry["field"] == "tenant_queues.unknown.tenant"
    assert "reserved for usage no job is known for" in entry["reason"]
    assert "DELETE /v1/tenant-queues/unknown" in entry["fix"]
    assert entry["entry"] == {"tenant": "unknown", "queue": "team-q"}

    spec = {"name": "j", "tenant": "team", "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 2}}]}
    submitted = await api.client.post("/v1/jobs", json=spec)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]

    async def admitted() -> bool:
        return bool((await api.client.get(f"/v1/jobs/{job_id}")).json()["state"] == "admitted")

    await eventually(admitted, what="another tenant's job admitted")

    other = await api.client.put("/v1/tenant-queues/other", json={"tenant": "other", "queue": "team-q"})
    assert other.status_code == 200, other.text
    altered = await api.client.put("/v1/tenant-queues/unknown", json={"tenant": "unknown", "queue": "team-q"})
    assert altered.status_code == 200, "the entry as stored, written again, is no new entry"
    moved = await api.client.put("/v1/config", json={"tenant_queues": [{"tenant": "unknown", "queue": "x"}]})
    assert (moved.status_code, moved.json()["field"]) == (422, "tenant_queues.unknown.tenant")

    assert (await api.client.delete("/v1/tenant-queues/unknown")).status_code == 204
    assert (await api.client.get("/v1/config/status")).json() == {"skipped": []}
