"""In the namespace tenants share, a job's pod template names only its own tenant's
PersistentVolumeClaims and ConfigMaps: those whose names begin with `<tenant>-` (a longer known
tenant's prefix wins). Each refusal names the field's path from the job spec's root and says why."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.admission.domain.pod_security import shared_namespace_errors
from tessera.admission.domain.tenant_objects import owner_of
from tessera.admission.domain.tokens import TokenRecord
from tessera.admission.service_layer.handlers import submit_job
from tessera.testing.builders import a_job

PREFIX = "pod_groups[0].template"
SPEC = f"{PREFIX}.spec"
C0 = f"{SPEC}.containers[0]"
NOW = datetime(2026, 11, 24, tzinfo=UTC)


def template(container: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "m", "image": "x:1", **(container or {})}], **spec}}


def pvc(name: str) -> dict[str, Any]:
    return template(volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": name}}])


def config_map_volume(name: str) -> dict[str, Any]:
    return template(volumes=[{"name": "cfg", "configMap": {"name": name}}])


def projected(name: str) -> dict[str, Any]:
    sources = [{"serviceAccountToken": {"path": "t"}}, {"configMap": {"name": name}}]
    return template(volumes=[{"name": "p", "projected": {"sources": sources}}])


def env_from(name: str) -> dict[str, Any]:
    return template({"envFrom": [{"configMapRef": {"name": name}}]})


def config_map_key(name: str) -> dict[str, Any]:
    env = [
        {"name": "A", "value": "1"},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": name, "key": "k"}}},
    ]
    return template({"env": env})


CASES = [
    (pvc, f"{SPEC}.volumes[0].persistentVolumeClaim.claimName", "PersistentVolumeClaim"),
    (config_map_volume, f"{SPEC}.volumes[0].configMap.name", "ConfigMap"),
    (projected, f"{SPEC}.volumes[0].projected.sources[1].configMap.name", "ConfigMap"),
    (env_from, f"{C0}.envFrom[0].configMapRef.name", "ConfigMap"),
    (config_map_key, f"{C0}.env[1].valueFrom.configMapKeyRef.name", "ConfigMap"),
]


@pytest.mark.parametrize(("make", "field", "kind"), CASES)
def test_another_tenants_object_is_refused_naming_the_field(make: Any, field: str, kind: str) -> None:
    (error,) = shared_namespace_errors(make("team-b-data"), PREFIX, "team-a", {"team-b"})
    assert error.field == field
    assert error.reason == (
        f"{kind} 'team-b-data' belongs to tenant 'team-b': in the namespace tenants share, a job may "
        "name only its own tenant's objects, whose names begin with 'team-a-'"
    )


@pytest.mark.parametrize(("make", "field", "kind"), CASES)
def test_an_object_without_the_tenants_prefix_is_refused(make: Any, field: str, kind: str) -> None:
    (error,) = shared_namespace_errors(make("datasets"), PREFIX, "team-a")
    assert error.field == field
    assert error.reason.startswith(
        f"{kind} 'datasets' does not begin with 'team-a-', so it is not tenant 'team-a''s"
    )


@pytest.mark.parametrize(("make", "field", "kind"), CASES)
def test_the_tenants_own_objects_are_accepted(make: Any, field: str, kind: str) -> None:
    assert shared_namespace_errors(make("team-a-data"), PREFIX, "team-a", {"team-b"}) == []


def test_a_longer_known_tenants_prefix_wins() -> None:
    assert owner_of("team-b-data", {"team", "team-b"}) == "team-b"
    assert owner_of("team-bx", {"team", "team-b"}) == "team"
    assert owner_of("teams-data", {"team"}) is None
    (error,) = shared_namespace_errors(pvc("team-b-data"), PREFIX, "team", {"team-b"})
    assert "belongs to tenant 'team-b'" in error.reason
    assert shared_namespace_errors(pvc("team-b-data"), PREFIX, "team-b", {"team"}) == []


def test_init_containers_and_the_clusters_ca_bundle() -> None:
    init = template(
        initContainers=[{"name": "i", "image": "x:1", "envFrom": [{"configMapRef": {"name": "b-x"}}]}]
    )
    assert [e.field for e in shared_namespace_errors(init, PREFIX, "a")] == [
        f"{SPEC}.initContainers[0].envFrom[0].configMapRef.name"
    ]
    assert shared_namespace_errors(projected("kube-root-ca.crt"), PREFIX, "a") == []
    assert shared_namespace_errors(pvc("kube-root-ca.crt"), PREFIX, "a") != [], "only the ConfigMap"


async def test_submission_refuses_another_known_tenants_claim(uow: Any) -> None:
    """The tenants known by their tokens and tenant queues decide whose a name is."""
    uow.configure(
        {
            "flavors": [{"name": "a100"}],
            "queues": [{"name": "q", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
            "tenant_queues": [{"tenant": "team", "queue": "q"}],
        }
    )
    uow.fake_tokens.by_hash["h"] = TokenRecord("t1", "team-b", admin=False, created_at=NOW)
    spec = a_job("j").tenant("team").group(gpus=1).as_dict()
    spec["pod_groups"][0]["template"] = pvc("team-b-data")
    async with uow:
        refused = await submit_job(spec, uow, "j1", templates_required=True)
        spec["pod_groups"][0]["template"] = pvc("team-data")
        accepted = await submit_job(spec, uow, "j2", templates_required=True)
        spec["pod_groups"][0]["template"] = pvc("elsewhere")
        adopted = await submit_job(spec, uow, "j3", templates_required=True, shared_namespace=False)
        await uow.commit()
    assert [e.field for e in refused.errors] == [f"{SPEC}.volumes[0].persistentVolumeClaim.claimName"]
    assert "belongs to tenant 'team-b'" in refused.errors[0].reason
    assert (accepted.state, accepted.errors) == ("queued", [])
    assert (adopted.state, adopted.errors) == ("queued", []), "a user's own workload is not held to it"


async def test_whose_a_name_is_depends_on_the_tenants_known_at_submission(uow: Any) -> None:
    """The limitation the README states: `team-b`'s names are safe from `team` only once admission
    knows `team-b`, and from then on `team`'s jobs naming them are refused."""
    uow.configure(
        {
            "flavors": [{"name": "a100"}],
            "queues": [{"name": "q", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
            "tenant_queues": [{"tenant": "team", "queue": "q"}],
        }
    )
    spec = a_job("j").tenant("team").group(gpus=1).as_dict()
    spec["pod_groups"][0]["template"] = pvc("team-b-data")
    async with uow:
        before = await submit_job(spec, uow, "j1", templates_required=True)
        uow.fake_tokens.by_hash["h"] = TokenRecord(
            "t1", "team-b", admin=False, created_at=NOW, revoked_at=NOW
        )
        after = await submit_job(spec, uow, "j2", templates_required=True)
        await uow.commit()
    assert (before.state, before.errors) == ("queued", []), "team-b unknown: the name fits team"
    assert [e.reason.split(":")[0] for e in after.errors] == [
        "PersistentVolumeClaim 'team-b-data' belongs to tenant 'team-b'"
    ], "a revoked token still makes its tenant known"
