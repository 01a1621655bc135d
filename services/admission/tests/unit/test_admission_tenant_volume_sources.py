"""In the namespace tenants share, an ephemeral volume's claim may be filled (`dataSource`,
`dataSourceRef`) only from its own tenant's PersistentVolumeClaim (a clone) or VolumeSnapshot, and a
pod may share only its own tenant's named ResourceClaim: else a template could clone another
tenant's volume, or use its devices, under a name of its own. A source whose owner the naming
convention cannot tell (a populator's object, another namespace) is refused."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.admission.domain.pod_security import shared_namespace_errors

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
