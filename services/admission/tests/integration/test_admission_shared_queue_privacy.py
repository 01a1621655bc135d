"""Tenants that share a queue: a tenant's token cannot learn the ids of another tenant's jobs, nor
whose a job id is. Another tenant's job is answered exactly as an unknown id (404), and the queue's
status lists only the caller's own jobs."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.testing.builders import a_job

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": "Bearer admin-secret"}
CONFIG = {
    "flavors": [{"name": "a100"}],
    "queues": [{"name": "shared", "quotas": [{"flavor": "a100", "resources": {"gpu": 8}}]}],
    "tenant_queues": [{"tenant": "team-a", "queue": "shared"}, {"tenant": "team-b", "queue": "shared"}],
}


async def tokens(api: Any) -> dict[str, dict[str, str]]:
    assert (await api.client.put("/v1/config", json=CONFIG, headers=ADMIN)).status_code == 200
    out = {}
    for tenant in ("team-a", "team-b"):
        made = await api.client.post("/v1/tokens", json={"tenant": tenant}, headers=ADMIN)
        out[tenant] = {"Authorization": f"Bearer {made.json()['token']}"}
    return out


async def submit(api: Any, name: str, tenant: str, headers: dict[str, str]) -> str:
    spec = a_job(name).tenant(tenant).group("w", replicas=1, gpus=1).as_dict()
    made = await api.client.post("/v1/jobs", json=spec, headers=headers)
    assert made.status_code == 201, made.text
    job_id: str = made.json()["id"]
    return job_id


async def test_another_tenants_job_is_answered_as_an_unknown_id(secured_api: Any) -> None:
    api = secured_api
    tok = await tokens(api)
    b_id = await submit(api, "secret-b", "team-b", tok["team-b"])
    for method, path in (("GET", f"/v1/jobs/{b_id}"), ("POST", f"/v1/jobs/{b_id}/cancel")):
        theirs = await api.client.request(method, path, headers=tok["team-a"])
        unknown = await api.client.request(method, path.replace(b_id, "no-such-job"), headers=tok["team-a"])
        assert theirs.status_code == unknown.status_code == 404, path
        assert theirs.json()["code"] == "not_found" and "team-b" not in theirs.text
        assert theirs.json()["field"] == unknown.json()["field"] == "job_id"
    assert (await api.client.get(f"/v1/jobs/{b_id}", headers=tok["team-b"])).status_code == 200
    assert (await api.client.get(f"/v1/jobs/{b_id}", headers=ADMIN)).status_code == 200
    still = await api.client.get(f"/v1/jobs/{b_id}", headers=ADMIN)
    assert still.json()["state"] != "cancelled", "team-a's cancel changed nothing"
    refused = await api.client.post(
        f"/v1/jobs/{b_id}/outcome", json={"state": "running"}, headers=tok["team-b"]
    )
    assert refused.status_code == 403, "an admin route stays forbidden to a tenant's token"


async def test_a_shared_queues_status_lists_only_the_callers_own_jobs(secured_api: Any) -> None:
    api = secured_api
    tok = await tokens(api)
    a_id = await submit(api, "mine-a", "team-a", tok["team-a"])
    b_id = await submit(api, "secret-b", "team-b", tok["team-b"])
    seen = (await api.client.get("/v1/queues/shared/status", headers=tok["team-a"])).json()
    listed = [j["id"] for j in seen["pending_jobs"]] + seen["admitted_jobs"]
    assert a_id in listed and b_id not in listed
    everything = (await api.client.get("/v1/queues/shared/status", headers=ADMIN)).json()
    assert {a_id, b_id} <= {j["id"] for j in everything["pending_jobs"]} | set(everything["admitted_jobs"])
