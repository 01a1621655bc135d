"""REST through the whole app: structured errors naming the field, bad configuration refused,
oversized jobs rejected, and bearer tokens that confine a tenant to its own queue and jobs."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.integration

FLAVORS = [{"name": "a100-80gb", "gpu_model": "A100-80GB"}, {"name": "t4"}]
QUEUE = {"name": "team-a", "cohort": "shared", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]}
CONFIG = {
    "flavors": FLAVORS,
    "queues": [QUEUE, {**QUEUE, "name": "team-b"}],
    "tenant_queues": [{"tenant": "a", "queue": "team-a"}, {"tenant": "b", "queue": "team-b"}],
    "priority_classes": [{"name": "high", "value": 1000}],
}


def job(tenant: str, gpus: int = 1, replicas: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "name": "train",
        "tenant": tenant,
        "pod_groups": [{"name": "w", "replicas": replicas, "gpu": {"count": gpus}}],
        **extra,
    }


@pytest.mark.parametrize(
    ("change", "field", "reason"),
    [
        (
            {"queues": [{**QUEUE, "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": -1}}]}]},
            "queues.team-a.flavors.a100-80gb.gpu.nominal",
            "quota below zero",
        ),
        (
            {"cohorts": [{"name": "shared", "parent": "x"}, {"name": "x", "parent": "shared"}]},
            "cohorts.shared.parent",
            "cohort cycle",
        ),
        (
            {"queues": [{**QUEUE, "quotas": [{"flavor": "h100", "resources": {"gpu": 8}}]}]},
            "queues.team-a.flavors.h100",
            "unknown flavor",
        ),
        ({"tenant_queues": [{"tenant": "c", "queue": "nowhere"}]}, "tenant_queues.c.queue", "unknown queue"),
    ],
)
async def test_bad_configuration_is_refused_naming_the_field(
    api: Any, change: dict[str, Any], field: str, reason: str
) -> None:
    assert (await api.client.put("/v1/config", json=CONFIG)).status_code == 200
    response = await api.client.put("/v1/config", json=change)
    assert response.status_code == 422
    body = response.json()
    assert (body["code"], body["field"]) == ("invalid_config", field)
    assert reason in body["message"]
    unchanged = (await api.client.get("/v1/config")).json()
    assert [q["quotas"][0]["resources"]["gpu"] for q in unchanged["queues"]] == [8, 8]


async def test_jobs_that_can_never_fit_are_rejected_naming_the_field(api: Any) -> None:
    assert (await api.client.put("/v1/config", json=CONFIG)).status_code == 200
    cases = [
        (job("a", gpus=8, replicas=3), "exceeds queue capacity"),
        (job("nobody"), "no tenant queue maps tenant 'nobody'"),
        (job("a", queue="team-b"), "may submit only to its own queue 'team-a'"),
        (job("a", priority_class="urgent"), "unknown priority class 'urgent'"),
        (
            {**job("a"), "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1, "models": ["H9"]}}]},
            "unknown flavor 'h9'",
        ),
    ]
    for spec, reason in cases:
        response = await api.client.post("/v1/jobs", json=spec)
        assert response.status_code == 422, spec
        body = response.json()
        assert body["code"] == "invalid_job" and body["field"]
        assert reason in body["errors"][0]["reason"], body
        stored = (await api.client.get(f"/v1/jobs/{body['job_id']}")).json()
        assert stored["state"] == "rejected"
        assert stored["history"][-1]["reason"].startswith("rejected: ")


async def test_crud_conflicts_and_missing_things_have_structured_bodies(api: Any) -> None:
    assert (await api.client.post("/v1/flavors", json=FLAVORS[0])).status_code == 201
    again = await api.client.post("/v1/flavors", json=FLAVORS[0])
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    missing = await api.client.get("/v1/queues/nope")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
    no_route = await api.client.get("/v1/nothing-here")
    assert no_route.status_code == 404 and no_route.json() == {
        "code": "not_found",
        "message": "Not Found",
        "field": None,
        "job_id": None,
        "errors": [],
        "request_id": None,
    }
    bad_body = await api.client.post("/v1/queues", json={"name": "q"})
    assert bad_body.status_code == 422 and bad_body.json()["field"] == "quotas"
    created = await api.client.put(
        "/v1/queues/q", json={"name": "q", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 2}}]}
    )
    assert created.status_code == 200
    assert (await api.client.delete("/v1/queues/q")).status_code == 204
    assert (await api.client.get("/v1/queues")).json() == []
    openapi = (await api.client.get("/openapi.json")).json()
    for path in (
        "/v1/queues",
        "/v1/cohorts",
        "/v1/tenant-queues",
        "/v1/priority-classes",
        "/v1/jobs",
        "/v1/jobs/{job_id}/cancel",
        "/v1/queues/{name}/status",
        "/v1/tokens",
    ):
        assert path in openapi["paths"], path


async def test_a_tenant_token_acts_for_its_tenant_alone(secured_api: Any) -> None:
    api = secured_api
    admin = {"Authorization": "Bearer admin-secret"}
    assert (await api.client.get("/v1/jobs")).status_code == 401
    unknown = await api.client.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert unknown.status_code == 401 and unknown.json()["field"] == "Authorization"
    assert (await api.client.put("/v1/config", json=CONFIG, headers=admin)).status_code == 200
    token_a = (await api.client.post("/v1/tokens", json={"tenant": "a"}, headers=admin)).json()["token"]
    stored = await api.scalar("SELECT count(*) FROM admission.tokens WHERE sha256 <> :t", t=token_a)
    assert stored == 1, "the token is stored hashed"
    as_a = {"Authorization": f"Bearer {token_a}"}

    assert (await api.client.put("/v1/config", json=CONFIG, headers=as_a)).status_code == 403
    forbidden = await api.client.post("/v1/jobs", json=job("b"), headers=as_a)
    assert forbidden.status_code == 403
    assert forbidden.json()["message"] == "tenant 'a' may not submit jobs on behalf of tenant 'b'"
    b_job = await api.client.post("/v1/jobs", json=job("b"), headers=admin)
    own = await api.client.post("/v1/jobs", json=job("a"), headers=as_a)
    assert own.status_code == 201
    # Another tenant's job is answered as an unknown id: a token learns nothing of whose it is.
    assert (await api.client.get(f"/v1/jobs/{b_job.json()['id']}", headers=as_a)).status_code == 404
    assert (await api.client.post(f"/v1/jobs/{b_job.json()['id']}/cancel", headers=as_a)).status_code == 404
    listed = (await api.client.get("/v1/jobs", headers=as_a)).json()
    assert [j["id"] for j in listed] == [own.json()["id"]]
    cancelled = await api.client.post(f"/v1/jobs/{own.json()['id']}/cancel", headers=as_a)
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    twice = await api.client.post(f"/v1/jobs/{own.json()['id']}/cancel", headers=as_a)
    assert twice.status_code == 409 and twice.json()["field"] == "state"
