"""Bad input through the whole app on real Postgres and NATS: each is answered 4xx naming the field
(never 500) and nothing of it is stored; a body over the limit is 413; the OpenAPI document types
the submit body as the JobSpec and lists the errors the API can return."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.admission.service_layer.handlers import handle_inventory
from tessera.contracts.events import InventoryChanged
from tessera.testing.builders import an_envelope
from tessera.testing.services import eventually

pytestmark = pytest.mark.integration

CONFIG = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [{"name": "team-a", "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 16}}]}],
    "tenant_queues": [{"tenant": "a", "queue": "team-a"}],
}


def job(**changes: Any) -> dict[str, Any]:
    return {
        "name": "train",
        "tenant": "a",
        "pod_groups": [{"name": "w", "replicas": 1, "gpu": {"count": 1}}],
    } | changes


def group(**fields: Any) -> dict[str, Any]:
    return job(pod_groups=[{"name": "w", "replicas": 1, **fields}])


RAW = {"content-type": "application/json"}
JOB_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("long name", {"json": job(name="a" * 64)}, "name", "at most 63 characters"),
    ("long tenant", {"json": job(tenant="a" * 64)}, "tenant", "at most 63 characters"),
    ("NUL in a label", {"json": job(labels={"k": "a\x00b"})}, "labels", "must not contain a NUL"),
    (
        "lone surrogate in a label",
        {
            "content": b'{"name":"x","tenant":"a","labels":{"k":"\\ud800"},"pod_groups":[{"name":"w","replicas":1}]}'
        }
        | {"headers": RAW},
        "labels.k",
        "valid string",
    ),
    (
        "cpu: Infinity",
        {"content": b'{"name":"x","tenant":"a","pod_groups":[{"name":"w","replicas":1,"cpu":Infinity}]}'}
        | {"headers": RAW},
        "pod_groups[0].cpu",
        "finite",
    ),
    ("cpu: 1e308", {"json": group(cpu=1e308)}, "pod_groups[0].cpu", "finite"),
    ("count: true", {"json": group(gpu={"count": True})}, "pod_groups[0].gpu.count", "valid integer"),
    ('count: "2"', {"json": group(gpu={"count": "2"})}, "pod_groups[0].gpu.count", "valid integer"),
    (
        "no resources",
        {"json": group(cpu=0, memory=0)},
        "pod_groups[0]",
        "must request some cpu, memory or GPU",
    ),
    (
        "a 65-character Idempotency-Key",
        {"json": job(), "headers": {"Idempotency-Key": "k" * 65}},
        "header.Idempotency-Key",
        "at most 64 characters",
    ),
]


@pytest.mark.parametrize(("case", "request_", "field", "reason"), JOB_CASES, ids=[c[0] for c in JOB_CASES])
async def test_a_bad_job_is_refused_naming_the_field_and_nothing_is_stored(
    api: Any, case: str, request_: dict[str, Any], field: str, reason: str
) -> None:
    response = await api.client.post("/v1/jobs", **request_)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["field"] == field and reason in body["errors"][0]["reason"], body
    assert await api.scalar("SELECT count(*) FROM admission.jobs") == 0


@pytest.mark.parametrize(
    ("url", "field"),
    [("/v1/jobs?tenant=%00", "query.tenant"), ("/v1/jobs/%00", "path"), ("/v1/queues/a%00/status", "path")],
)
async def test_a_nul_in_the_query_or_path_is_400_naming_where(api: Any, url: str, field: str) -> None:
    response = await api.client.get(url)
    assert response.status_code == 400
    assert (response.json()["code"], response.json()["field"]) == ("bad_request", field)


async def test_a_priority_class_value_beyond_kubernetes_range_is_refused(api: Any) -> None:
    response = await api.client.post("/v1/priority-classes", json={"name": "huge", "value": 2**31})
    assert response.status_code == 422
    assert response.json()["field"] == "value"
    assert (await api.client.get("/v1/priority-classes")).json() == []


async def test_a_body_over_the_limit_is_413_and_not_stored(api: Any) -> None:
    big = job(labels={f"k{i}": "v" * 200 for i in range(64)})
    big["pod_groups"][0]["template"] = {"metadata": {"annotations": {"pad": "x" * (1024 * 1024)}}}
    response = await api.client.post("/v1/jobs", json=big)
    assert response.status_code == 413
    assert (response.json()["code"], response.json()["field"]) == ("too_large", "body")
    assert await api.scalar("SELECT count(*) FROM admission.jobs") == 0


async def test_a_pod_larger_than_every_node_waits_naming_the_shape(api: Any) -> None:
    assert (await api.client.put("/v1/config", json=CONFIG)).status_code == 200
    gpus = [{"index": i, "uuid": f"GPU-{i}", "model": "A100-80GB", "memory_mib": 81920} for i in range(8)]
    node = {"name": "node-1", "cpu_milli": 64000, "memory_mib": 512000, "gpus": gpus}
    async with api.ctx.uow() as uow:
        changed = InventoryChanged.model_validate({"source": "cluster", "nodes": [node]})
        await handle_inventory(an_envelope(changed), uow)
        await uow.commit()
    response = await api.client.post("/v1/jobs", json=group(gpu={"count": 16}))
    assert response.status_code == 201
    job_id = response.json()["id"]

    async def explained() -> bool:
        waiting = (await api.client.get(f"/v1/jobs/{job_id}")).json()["waiting"]
        return waiting is not None and waiting["reason"] == "NoFeasiblePlacement"

    await eventually(explained, what="the job's wait explained")
    waiting = (await api.client.get(f"/v1/jobs/{job_id}")).json()["waiting"]
    assert waiting["message"] == (
        "no node shape holds a pod of 'w' (16 GPUs): the largest node, node-1, has 8 x A100-80GB"
    )


async def test_the_openapi_document_types_the_job_and_lists_the_errors(api: Any) -> None:
    document = (await api.client.get("/openapi.json")).json()
    submit = document["paths"]["/v1/jobs"]["post"]
    schema = submit["requestBody"]["content"]["application/json"]["schema"]
    assert schema["$ref"] == "#/components/schemas/JobSpec"
    job_spec = document["components"]["schemas"]["JobSpec"]
    assert {"name", "tenant", "pod_groups", "labels", "priority_class"} <= set(job_spec["properties"])
    assert set(job_spec["required"]) == {"name", "tenant", "pod_groups"}
    assert {"400", "401", "403", "413", "422", "500"} <= set(submit["responses"])
    headers = [p for p in submit["parameters"] if p["in"] == "header"]
    assert [(h["name"], h["schema"]["anyOf"][0]["maxLength"]) for h in headers] == [("Idempotency-Key", 64)]
