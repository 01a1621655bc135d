"""A tenant's token reads only its own queue's configuration and status: its queue, its tenant
queue, the cohorts above its queue, and the flavors and priority classes any job may name. The
admin token reads everything."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Api

pytestmark = pytest.mark.integration

ADMIN = {"Authorization": "Bearer admin-secret"}
QUOTA = [{"flavor": "a100-80gb", "resources": {"gpu": 8}}]
CONFIG = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "cohorts": [{"name": "org"}, {"name": "shared", "parent": "org"}, {"name": "elsewhere"}],
    "queues": [
        {"name": "team-a", "cohort": "shared", "quotas": QUOTA},
        {"name": "team-b", "cohort": "shared", "quotas": QUOTA},
        {"name": "team-c", "cohort": "elsewhere", "quotas": QUOTA},
    ],
    "tenant_queues": [
        {"tenant": "a", "queue": "team-a"},
        {"tenant": "b", "queue": "team-b"},
        {"tenant": "c", "queue": "team-c"},
    ],
    "priority_classes": [{"name": "high", "value": 1000}],
}


def names(items: list[dict[str, Any]], key: str = "name") -> list[str]:
    return sorted(i[key] for i in items)


async def test_a_tenant_reads_only_its_own_queues_configuration_and_usage(secured_api: Api) -> None:
    api = secured_api
    assert (await api.client.put("/v1/config", json=CONFIG, headers=ADMIN)).status_code == 200
    token = (await api.client.post("/v1/tokens", json={"tenant": "a"}, headers=ADMIN)).json()["token"]
    as_a = {"Authorization": f"Bearer {token}"}

    async def get(path: str, headers: dict[str, str] = as_a) -> Any:
        response = await api.client.get(path, headers=headers)
        assert response.status_code == 200, (path, response.text)
        return response.json()

    assert names(await get("/v1/queues")) == ["team-a"]
    assert names(await get("/v1/tenant-queues"), "tenant") == ["a"]
    assert names(await get("/v1/cohorts")) == ["org", "shared"]
    assert names(await get("/v1/flavors")) == ["a100-80gb"]
    assert names(await get("/v1/priority-classes")) == ["high"]
    document = await get("/v1/config")
    assert names(document["queues"]) == ["team-a"] and names(document["tenant_queues"], "tenant") == ["a"]
    assert names(document["cohorts"]) == ["org", "shared"]
    assert (await get("/v1/queues/team-a"))["name"] == "team-a"
    assert (await get("/v1/queues/team-a/status"))["name"] == "team-a"
    for hidden, kind, name in (
        ("/v1/queues/team-b", "queue", "team-b"),
        ("/v1/queues/team-b/status", "queue", "team-b"),
        ("/v1/queues/team-c/status", "queue", "team-c"),
        ("/v1/tenant-queues/b", "tenant queue", "b"),
        ("/v1/cohorts/elsewhere", "cohort", "elsewhere"),
    ):
        response = await api.client.get(hidden, headers=as_a)
        assert response.status_code == 404, hidden
        assert response.json()["message"] == f"no {kind} named {name!r}", "answered as if unknown"

    assert names(await get("/v1/queues", ADMIN)) == ["team-a", "team-b", "team-c"]
    assert names((await get("/v1/config", ADMIN))["tenant_queues"], "tenant") == ["a", "b", "c"]
    assert (await get("/v1/queues/team-b/status", ADMIN))["name"] == "team-b"
