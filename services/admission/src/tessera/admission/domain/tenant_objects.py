"""Which PersistentVolumeClaims, ConfigMaps, VolumeSnapshots and ResourceClaims a job's pod template
may name in the namespace that tenants share. Pure.

Every tenant's jobs run in that one namespace, so a template could mount another tenant's volume or
read its configuration. By convention an object there belongs to the tenant whose name, followed by
`-`, begins its name: `research-datasets` is tenant `research`'s. Where one known tenant's name
extends another's (`team` and `team-b`), a name belongs to the longest that fits: `team-b-data` is
`team-b`'s, not `team`'s. The cluster's own `kube-root-ca.crt` (the cluster's CA, in every
namespace) may be named by anyone.

The tenants known (by tenant queues and tokens, at submission) decide this, so a tenant admission
does not know is not protected from one whose name its own extends (`team` may name `team-b-data`
while `team-b` is unknown), and a tenant made known later makes such a name refused from then on.
Refusing every name with a further `-` instead would refuse `team-my-data`; the README tells
operators to make a tenant known before making its objects, or to choose names that do not extend
one another.

A template may name, by `volumes[].persistentVolumeClaim.claimName`, `volumes[].configMap.name`,
`volumes[].projected.sources[].configMap.name`, `envFrom[].configMapRef.name`,
`env[].valueFrom.configMapKeyRef.name` and `resourceClaims[].resourceClaimName` (a ResourceClaim is
devices, and state, that its pods share), only its own tenant's objects. An ephemeral volume's claim
(`volumes[].ephemeral.volumeClaimTemplate.spec`) may be filled, by its `dataSource` or
`dataSourceRef`, only from its own tenant's PersistentVolumeClaim (a clone) or VolumeSnapshot
(`snapshot.storage.k8s.io`); a source of any other kind (a volume populator's object, whose owner
admission cannot tell) or in another namespace is refused. Nor may that claim bind a
PersistentVolume of its choosing, by name (`volumeName`) or by labels (`selector`): a
PersistentVolume is in no namespace, so its name tells no tenant, and a claim that binds it reads
whatever another tenant left there. A job reaches a volume made for its tenant through a claim named
for the tenant (`persistentVolumeClaim.claimName`)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from tessera.contracts.base import FieldError

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
ANYONES = frozenset({"kube-root-ca.crt"})
"""ConfigMaps every namespace holds, which any tenant may name."""
DATA_SOURCES = {"": "PersistentVolumeClaim", "snapshot.storage.k8s.io": "VolumeSnapshot"}
"""The API group of each kind a claim may be filled from, which the naming convention says whose it is."""


def owner_of(name: str, tenants: Collection[str]) -> str | None:
    """The known tenant whose `<tenant>-` prefix is the longest that begins ``name``, or None."""
    fits = [t for t in tenants if name.startswith(f"{t}-")]
    return max(fits, key=len) if fits else None


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def ephemeral_claims(spec: Mapping[str, Any], at: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, claim spec) of each of the pod spec's ephemeral volumes."""
    for i, volume in enumerate(_list(spec.get("volumes"))):
        where = f"{at}.volumes[{i}].ephemeral.volumeClaimTemplate.spec"
        yield where, _map(_map(_map(_map(volume).get("ephemeral")).get("volumeClaimTemplate")).get("spec"))


def data_sources(spec: Mapping[str, Any], at: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, source) of each `dataSource` and `dataSourceRef` of the pod spec's ephemeral volumes."""
    for where, claim in ephemeral_claims(spec, at):
        for key in ("dataSource", "dataSourceRef"):
            if claim.get(key) is not None:
                yield f"{where}.{key}", _map(claim[key])


def _source_kind(source: Mapping[str, Any]) -> str | None:
    """The kind of a data source the naming convention tells the owner of, or None."""
    kind = DATA_SOURCES.get(source.get("apiGroup") or "")
    return kind if kind is not None and source.get("kind") == kind else None


def _references(spec: Mapping[str, Any], at: str) -> Iterator[tuple[str, str, object]]:
    """(path, kind, name) of each PersistentVolumeClaim, ConfigMap, VolumeSnapshot and ResourceClaim
    the pod spec names."""
    for path, source in data_sources(spec, at):
        kind = _source_kind(source)
        if kind is not None:
            yield f"{path}.name", kind, source.get("name")
    for i, claim in enumerate(_list(spec.get("resourceClaims"))):
        claim = _map(claim)
        yield f"{at}.resourceClaims[{i}].resourceClaimName", "ResourceClaim", claim.get("resourceClaimName")
        name = _map(claim.get("source")).get("resourceClaimName")  # before Kubernetes 1.31
        yield f"{at}.resourceClaims[{i}].source.resourceClaimName", "ResourceClaim", name
    for i, volume in enumerate(_list(spec.get("volumes"))):
        volume = _map(volume)
        where = f"{at}.volumes[{i}]"
        if "persistentVolumeClaim" in volume:
            claim = _map(volume["persistentVolumeClaim"]).get("claimName")
            yield f"{where}.persistentVolumeClaim.claimName", "PersistentVolumeClaim", claim
        if "configMap" in volume:
            yield f"{where}.configMap.name", "ConfigMap", _map(volume["configMap"]).get("name")
        for j, source in enumerate(_list(_map(volume.get("projected")).get("sources"))):
            if "configMap" in _map(source):
                name = _map(_map(source)["configMap"]).get("name")
                yield f"{where}.projected.sources[{j}].configMap.name", "ConfigMap", name
    for kind in CONTAINER_LISTS:
        for c, container in enumerate(_list(spec.get(kind))):
            container = _map(container)
            where = f"{at}.{kind}[{c}]"
            for k, source in enumerate(_list(container.get("envFrom"))):
                if "configMapRef" in _map(source):
                    name = _map(_map(source)["configMapRef"]).get("name")
                    yield f"{where}.envFrom[{k}].configMapRef.name", "ConfigMap", name
            for k, variable in enumerate(_list(container.get("env"))):
                value_from = _map(_map(variable).get("valueFrom"))
                if "configMapKeyRef" in value_from:
                    name = _map(value_from["configMapKeyRef"]).get("name")
                    yield f"{where}.env[{k}].valueFrom.configMapKeyRef.name", "ConfigMap", name


def _source_errors(spec: Mapping[str, Any], at: str, prefix: str) -> Iterator[FieldError]:
    """A refusal for each ephemeral volume's data source that is in another namespace, or of a kind
    whose owner the naming convention does not tell."""
    for path, source in data_sources(spec, at):
        if source.get("namespace") not in (None, ""):
            yield FieldError(
                field=f"{path}.namespace",
                reason=f"must be unset: a job in the namespace tenants share may fill a volume only from "
                f"its own tenant's objects there, and {source.get('namespace')!r} is another namespace",
            )
        if _source_kind(source) is None:
            group = source.get("apiGroup")
            of = f"API group {group!r}" if group else "the core API group"
            yield FieldError(
                field=f"{path}.kind",
                reason=f"a {source.get('kind')!r} of {of} cannot fill a volume in the namespace tenants "
                "share: admission cannot tell whose such an object is, so a volume may be filled only "
                f"from a PersistentVolumeClaim, or a VolumeSnapshot of 'snapshot.storage.k8s.io', whose "
                f"name begins with {prefix!r}",
            )


def _bound_volume_errors(spec: Mapping[str, Any], at: str) -> Iterator[FieldError]:
    """A refusal for each ephemeral volume's claim that chooses the PersistentVolume it binds."""
    for where, claim in ephemeral_claims(spec, at):
        name = claim.get("volumeName")
        if name not in (None, ""):
            yield FieldError(
                field=f"{where}.volumeName",
                reason=f"must be unset: in the namespace tenants share, a job's claim may not bind "
                f"PersistentVolume {name!r}, whose name tells no tenant (a PersistentVolume is in no "
                "namespace), so it may be another tenant's; name a claim of the job's own tenant "
                "(persistentVolumeClaim.claimName) instead",
            )
        selector = claim.get("selector")
        if selector is not None and (
            not isinstance(selector, Mapping)
            or selector.get("matchLabels")
            or selector.get("matchExpressions")
        ):
            yield FieldError(
                field=f"{where}.selector",
                reason="must be unset: in the namespace tenants share, a job's claim may not choose the "
                "PersistentVolume it binds by labels: admission cannot tell whose the volumes they "
                "select are, so they may be another tenant's; name a claim of the job's own tenant "
                "(persistentVolumeClaim.claimName) instead",
            )


def foreign_object_errors(
    spec: Mapping[str, Any], at: str, tenant: str, tenants: Collection[str] = ()
) -> list[FieldError]:
    """A refusal for each object the pod spec (at path ``at``) names that is not ``tenant``'s, and for
    each volume's data source whose owner cannot be told, and for each claim that chooses the
    PersistentVolume it binds. ``tenants``: the other tenants known, so that a name fitting a longer
    one's prefix goes to it."""
    known = {*tenants, tenant}
    prefix = f"{tenant}-"
    errors = [*_source_errors(spec, at, prefix), *_bound_volume_errors(spec, at)]
    for path, kind, name in _references(spec, at):
        if not isinstance(name, str) or not name or (kind == "ConfigMap" and name in ANYONES):
            continue  # a missing name is the schema's to refuse
        owner = owner_of(name, known)
        if owner == tenant:
            continue
        whose = (
            f"belongs to tenant {owner!r}"
            if owner is not None
            else f"does not begin with {prefix!r}, so it is not tenant {tenant!r}'s"
        )
        errors.append(
            FieldError(
                field=path,
                reason=f"{kind} {name!r} {whose}: in the namespace tenants share, a job may name only its "
                f"own tenant's objects, whose names begin with {prefix!r}",
            )
        )
    return errors
