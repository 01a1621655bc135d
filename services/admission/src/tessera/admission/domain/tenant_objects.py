"""Which PersistentVolumeClaims and ConfigMaps a job's pod template may name in the namespace that
tenants share. Pure.

Every tenant's jobs run in that one namespace, so a template could mount another tenant's volume or
read its configuration. By convention an object there belongs to the tenant whose name, followed by
`-`, begins its name: `research-datasets` is tenant `research`'s. Where one known tenant's name
extends another's (`team` and `team-b`), a name belongs to the longest that fits: `team-b-data` is
`team-b`'s, not `team`'s. The cluster's own `kube-root-ca.crt` (the cluster's CA, in every
namespace) may be named by anyone.

A template may name, by `volumes[].persistentVolumeClaim.claimName`, `volumes[].configMap.name`,
`volumes[].projected.sources[].configMap.name`, `envFrom[].configMapRef.name` and
`env[].valueFrom.configMapKeyRef.name`, only its own tenant's objects."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from typing import Any

from tessera.contracts.base import FieldError

CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
ANYONES = frozenset({"kube-root-ca.crt"})
"""ConfigMaps every namespace holds, which any tenant may name."""


def owner_of(name: str, tenants: Collection[str]) -> str | None:
    """The known tenant whose `<tenant>-` prefix is the longest that begins ``name``, or None."""
    fits = [t for t in tenants if name.startswith(f"{t}-")]
    return max(fits, key=len) if fits else None


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _references(spec: Mapping[str, Any], at: str) -> Iterator[tuple[str, str, object]]:
    """(path, kind, name) of each PersistentVolumeClaim and ConfigMap the pod spec names."""
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


def foreign_object_errors(
    spec: Mapping[str, Any], at: str, tenant: str, tenants: Collection[str] = ()
) -> list[FieldError]:
    """A refusal for each PersistentVolumeClaim or ConfigMap the pod spec (at path ``at``) names that
    is not ``tenant``'s. ``tenants``: the other tenants known, so that a name fitting a longer one's
    prefix goes to it."""
    known = {*tenants, tenant}
    prefix = f"{tenant}-"
    errors = []
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
                f"own tenant's PersistentVolumeClaims and ConfigMaps, whose names begin with {prefix!r}",
            )
        )
    return errors
