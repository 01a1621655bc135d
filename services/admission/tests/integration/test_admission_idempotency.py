"""Idempotency-Key through the whole app on real Postgres: a key is its tenant's own, a retry with
the same body answers with the same job (concurrent retries too), and the same key with another
body is refused with 409 naming the key."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from .conftest import Api

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": "Bearer admin-secret"}
QUEUE = {"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]}
CONFIG = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [QUEUE, {**QUEUE, "name": "team-b"}],
    "tenant_queues": [{"tenant": "a", "queue": "team-a"}, {"tenant": "b", "queue": "team-b"}],
}


def job(tenant: str, name: str = "train", gpus: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "tenant": tenant,
        "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": gpus}}],
    }


async def tenants(api: Api) -> tuple[dict[str, str], dict[str, str]]:
    assert (await api.client.put("/v1/config", json=CONFIG, headers=ADMIN)).status_code == 200
    made = [(await api.client.post("/v1/tokens", json={"tenant": t}, headers=ADMIN)).json() for t in "ab"]
    return tuple({"Authorization": f"Bearer {m['token']}"} for m in made)  # type: ignore[return-value]


async def jobs_of(api: Api, tenant: str) -> int:
    return int(await api.scalar("SELECT count(*) FROM admission.jobs WHERE tenant = :t", t=tenant))


async def test_a_key_is_its_tenants_own(secured_api: Api) -> None:
    api = secured_api
    as_a, as_b = await tenants(api)
    b_keyed = await api.client.post("/v1/jobs", json=job("b"), headers={**as_b, "Idempotency-Key": "nightly"})
    assert b_keyed.status_code == 201 and b_keyed.json()["id"] == "nightly", "a free key names the job"
    b_plain = (await api.client.post("/v1/jobs", json=job("b"), headers=as_b)).json()["id"]

    for key in ("nightly", b_plain):  # B's key, and B's job id sent as a key
        mine = await api.client.post("/v1/jobs", json=job("a"), headers={**as_a, "Idempotency-Key": key})
        assert mine.status_code == 201, mine.text
        assert mine.json()["id"] not in ("nightly", b_plain), "A never gets B's job back"
        shown = await api.client.get(f"/v1/jobs/{mine.json()['id']}", headers=as_a)
        assert shown.status_code == 200 and shown.json()["tenant"] == "a"
        again = await api.client.post("/v1/jobs", json=job("a"), headers={**as_a, "Idempotency-Key": key})
        assert again.json()["id"] == mine.json()["id"], "A's own retry answers with A's job"
    assert (await jobs_of(api, "a"), await jobs_of(api, "b")) == (2, 2)
    retried = await api.client.post("/v1/jobs", json=job("b"), headers={**as_b, "Idempotency-Key": "nightly"})
    assert retried.json()["id"] == "nightly"


async def test_the_same_key_with_another_body_is_a_conflict(secured_api: Api) -> None:
    api = secured_api
    as_a, _ = await tenants(api)
    key = {"Idempotency-Key": "run-42"}
    first = await api.client.post("/v1/jobs", json=job("a"), headers={**as_a, **key})
    assert first.status_code == 201
    reordered = json.dumps(dict(reversed(list(job("a").items()))))
    same = await api.client.post(
        "/v1/jobs", content=reordered, headers={**as_a, **key, "Content-Type": "application/json"}
    )
    assert same.status_code == 201 and same.json()["id"] == first.json()["id"], (
        "the same job, spelled otherwise"
    )
    other = await api.client.post("/v1/jobs", json=job("a", gpus=2), headers={**as_a, **key})
    assert other.status_code == 409, other.text
    body = other.json()
    assert body["code"] == "conflict" and body["field"] == "header.Idempotency-Key"
    assert "'run-42'" in body["message"] and first.json()["id"] in body["message"]
    assert await jobs_of(api, "a") == 1
    by_admin = await api.client.post("/v1/jobs", json=job("a", name="other"), headers={**ADMIN, **key})
    assert by_admin.status_code == 409, "the key belongs to the job's tenant, whoever sends it"


async def test_concurrent_retries_make_one_job(secured_api: Api) -> None:
    api = secured_api
    as_a, as_b = await tenants(api)
    sent = [
        api.client.post("/v1/jobs", json=job(t), headers={**h, "Idempotency-Key": "burst"})
        for _ in range(4)
        for t, h in (("a", as_a), ("b", as_b))
    ]
    answers = await asyncio.gather(*sent)
    assert all(r.status_code == 201 for r in answers), [r.text for r in answers]
    ids = {(r.request.headers["Authorization"], r.json()["id"]) for r in answers}
    assert len(ids) == 2, "one job per tenant"
    assert len({job_id for _, job_id in ids}) == 2
    assert (await jobs_of(api, "a"), await jobs_of(api, "b")) == (1, 1)
