"""In the namespace tenants share, an ephemeral volume's claim may be filled (`dataSource`,
`dataSourceRef`) only from its own tenant's PersistentVolumeClaim (a clone) or VolumeSnapshot, and a
pod may share only its own tenant's named ResourceClaim: else a template could clone another
tenant's volume, or use its devices, under a name of its own. A source whose owner the naming
convention cannot tell (a populator's object, another namespace) is refused, and so is a claim that
chooses the PersistentVolume it binds (`volumeName`, `selector`): a PersistentVolume is in no
namespace, so its name tells no tenant."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.admission.domain.pod_security import shared_namespace_errors
from tessera.admission.service_layer.handlers import submit_job
from tessera.testing.builders import a_job

PREFIX = "pod_groups[0].template"
SPEC = f"{PREFIX}.spec"
CLAIM = f"{SPEC}.volumes[1].ephemeral.volumeClaimTemplate.spec"
PVC = {"kind": "PersistentVolumeClaim", "name": "research-datasets"}
SNAPSHOT = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "research-snap"}


def ephemeral(**claim_spec: Any) -> dict[str, Any]:
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, **claim_spec}
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": claim}}},
    ]
    return {"spec": {"containers": [{"name": "m", "image": "x:1"}], "volumes": volumes}}


def errors(template: dict[str, Any], tenant: str = "team", *tenants: str) -> list[tuple[str, str]]:
    return [(e.field, e.reason) for e in shared_namespace_errors(template, PREFIX, tenant, tenants)]


@pytest.mark.parametrize("key", ["dataSource", "dataSourceRef"])
@pytest.mark.parametrize("source", [PVC, SNAPSHOT])
def test_a_volume_filled_from_another_tenants_claim_or_snapshot_is_refused(
    key: str, source: dict[str, str]
) -> None:
    ((field, reason),) = errors(ephemeral(**{key: source}), "team", "research")
    assert field == f"{CLAIM}.{key}.name"
    assert reason.startswith(f"{source['kind']} {source['name']!r} belongs to tenant 'research'")
    ((_, unknown),) = errors(ephemeral(**{key: source}))
    assert "does not begin with 'team-'" in unknown


def test_both_data_source_fields_are_checked_and_own_sources_accepted() -> None:
    both = ephemeral(dataSource=PVC, dataSourceRef=PVC)
    assert [f for f, _ in errors(both)] == [f"{CLAIM}.dataSource.name", f"{CLAIM}.dataSourceRef.name"]
    own = {**SNAPSHOT, "name": "team-snap"}
    assert errors(ephemeral(dataSource=own, dataSourceRef=own), "team", "research") == []
    assert errors(ephemeral(dataSourceRef={**PVC, "apiGroup": "", "name": "team-data"})) == []
    assert errors(ephemeral(dataSource=None)) == [], "null is no source"
    assert errors(ephemeral()) == []


@pytest.mark.parametrize(
    ("source", "of"),
    [
        ({"apiGroup": "populators.example.com", "kind": "Dataset", "name": "team-data"}, "API group"),
        ({"kind": "VolumeSnapshot", "name": "team-snap"}, "the core API group"),
        ({"apiGroup": "example.com", "kind": "PersistentVolumeClaim", "name": "team-x"}, "API group"),
    ],
)
def test_a_volume_filled_from_an_object_whose_owner_cannot_be_told_is_refused(
    source: dict[str, str], of: str
) -> None:
    """A volume populator's object may name anything, another tenant's volume included; even under
    the tenant's own name admission cannot tell what it fills the volume from."""
    ((field, reason),) = errors(ephemeral(dataSourceRef=source))
    assert field == f"{CLAIM}.dataSourceRef.kind"
    assert reason.startswith(f"a {source['kind']!r} of {of}")
    assert "admission cannot tell whose such an object is" in reason


def test_a_volume_filled_from_another_namespace_is_refused() -> None:
    source = {**PVC, "name": "team-data", "namespace": "research"}
    ((field, reason),) = errors(ephemeral(dataSourceRef=source))
    assert field == f"{CLAIM}.dataSourceRef.namespace"
    assert "'research' is another namespace" in reason


@pytest.mark.parametrize(
    ("claim", "field"),
    [
        ({"name": "gpu", "resourceClaimName": "research-gpus"}, "resourceClaimName"),
        ({"name": "gpu", "source": {"resourceClaimName": "research-gpus"}}, "source.resourceClaimName"),
    ],
)
def test_another_tenants_resource_claim_is_refused(claim: dict[str, Any], field: str) -> None:
    template = {"spec": {"containers": [{"name": "m", "image": "x:1"}], "resourceClaims": [claim]}}
    ((path, reason),) = errors(template, "team", "research")
    assert path == f"{SPEC}.resourceClaims[0].{field}"
    assert reason.startswith("ResourceClaim 'research-gpus' belongs to tenant 'research'")
    own = {"name": "gpu", "resourceClaimName": "team-gpus"}
    from_template = {"name": "t", "resourceClaimTemplateName": "gpu-template"}
    template["spec"]["resourceClaims"] = [own, from_template]
    assert errors(template, "team", "research") == [], "a claim made from a template is the pod's own"


@pytest.mark.parametrize("name", ["research-scratch", "team-scratch", "pv-0042"])
def test_a_claim_binding_a_persistent_volume_by_name_is_refused(name: str) -> None:
    """Even under the tenant's own prefix: a PersistentVolume is in no namespace, and no convention
    says whose one is, so an Available one may hold another tenant's data."""
    ((field, reason),) = errors(ephemeral(volumeName=name), "team", "research")
    assert field == f"{CLAIM}.volumeName"
    assert reason.startswith(
        f"must be unset: in the namespace tenants share, a job's claim may not bind PersistentVolume {name!r}"
    )
    assert errors(ephemeral(volumeName="")) == [], "an empty name binds no volume of the claim's choosing"


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {"tenant": "research"}},
        {"matchExpressions": [{"key": "tenant", "operator": "In", "values": ["research"]}]},
    ],
)
def test_a_claim_choosing_its_persistent_volume_by_labels_is_refused(selector: dict[str, Any]) -> None:
    ((field, reason),) = errors(ephemeral(selector=selector))
    assert field == f"{CLAIM}.selector"
    assert "admission cannot tell whose the volumes they select are" in reason
    assert errors(ephemeral(selector={})) == [], "an empty selector matches any volume, as none does"
    assert errors(ephemeral(selector=None)) == []


async def test_submission_refuses_a_claim_that_chooses_its_volume(uow: Any) -> None:
    """Both fields are refused at once, naming each; a user's own workload is not held to it."""
    uow.configure(
        {
            "flavors": [{"name": "a100"}],
            "queues": [{"name": "q", "quotas": [{"flavor": "a100", "resources": {"gpu": 4}}]}],
            "tenant_queues": [{"tenant": "team", "queue": "q"}],
        }
    )
    spec = a_job("j").tenant("team").group(gpus=1).as_dict()
    chosen = ephemeral(volumeName="research-scratch", selector={"matchLabels": {"tenant": "research"}})
    spec["pod_groups"][0]["template"] = chosen
    async with uow:
        refused = await submit_job(spec, uow, "j1", templates_required=True)
        adopted = await submit_job(spec, uow, "j2", templates_required=True, shared_namespace=False)
        spec["pod_groups"][0]["template"] = ephemeral()
        accepted = await submit_job(spec, uow, "j3", templates_required=True)
        await uow.commit()
    assert refused.state != "queued"
    assert [e.field for e in refused.errors] == [f"{CLAIM}.volumeName", f"{CLAIM}.selector"]
    assert (adopted.state, adopted.errors) == ("queued", [])
    assert (accepted.state, accepted.errors) == ("queued", [])
