"""Pod templates checked against the Kubernetes OpenAPI schema, as the API server would take them.

The schema is `io.k8s.api.core.v1.PodTemplateSpec` from kubernetes-validate's strict schemas (an
unknown field is an error, as with `kubectl apply --validate=strict`). Two rules the API server
enforces beyond the OpenAPI schema are checked too: a pod has at least one container, and every
container names an image. Each error names its path from the job spec's root, e.g.
`pod_groups[0].template.spec.containers[0].image: required`.

A job's templates must also keep to what a namespace shared by tenants allows (`pod_security`): the
Pod Security Standards' baseline, the default service account, no Secret references, and no other
tenant's PersistentVolumeClaims, ConfigMaps, VolumeSnapshots or ResourceClaims (nor a volume filled
from an object whose owner admission cannot tell).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Iterable, Mapping
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]
from referencing import Registry, Resource

from tessera.admission.domain.pod_security import shared_namespace_errors
from tessera.contracts.base import FieldError
from tessera.contracts.jobs import JobSpec

KUBERNETES_SCHEMA_VERSION = "v1.37.0"
"""The Kubernetes release whose OpenAPI schema templates are checked against."""
TEMPLATE_DEFINITION = "io.k8s.api.core.v1.PodTemplateSpec"


@functools.cache
def _validator() -> Draft202012Validator:
    folder = resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema", f"{KUBERNETES_SCHEMA_VERSION}-local-strict"
    )
    definitions = json.loads(folder.joinpath("_definitions.json").read_text())
    schema = {"$ref": f"_definitions.json#/$defs/{TEMPLATE_DEFINITION}"}
    registry: Registry[Any] = Registry().with_resource(
        "_definitions.json", Resource.from_contents(definitions)
    )
    return Draft202012Validator(schema, registry=registry)


def _path(prefix: str, parts: Iterable[str | int]) -> str:
    path = prefix
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _reason(error: ValidationError) -> tuple[list[str | int], str]:
    """(extra path, reason) of one schema error, in the API server's words where they are short."""
    parts = list(error.absolute_path)
    if error.validator == "required":
        missing = str(error.message).split("'")[1] if "'" in error.message else str(error.message)
        return [*parts, missing], "required"
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        known = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) else {}
        unknown = sorted(str(key) for key in error.instance if key not in known)
        return [*parts, unknown[0]] if unknown else parts, "is not a known field"
    if error.validator == "type":
        return parts, f"must be of type {error.validator_value}, got {error.instance!r}"
    if error.validator == "enum":
        return parts, f"must be one of {', '.join(map(str, error.validator_value))}"
    return parts, str(error.message)


def template_errors(template: object, prefix: str) -> list[FieldError]:
    """Every problem of one PodTemplateSpec; an empty list when the API server would take it."""
    if not isinstance(template, Mapping):
        return [FieldError(field=prefix, reason="must be a PodTemplateSpec object (metadata, spec)")]
    errors: list[FieldError] = []
    for error in sorted(_validator().iter_errors(dict(template)), key=lambda e: list(map(str, e.path))):
        parts, reason = _reason(error)
        errors.append(FieldError(field=_path(prefix, parts), reason=reason))
    spec = template.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(spec, Mapping):
        errors.append(FieldError(field=f"{prefix}.spec", reason="required"))
    elif not containers:
        errors.append(
            FieldError(field=f"{prefix}.spec.containers", reason="required: at least one container")
        )
    elif isinstance(containers, list):
        for index, container in enumerate(containers):
            if isinstance(container, Mapping) and not container.get("image"):
                errors.append(FieldError(field=f"{prefix}.spec.containers[{index}].image", reason="required"))
    return _unique(errors)


def _unique(errors: list[FieldError]) -> list[FieldError]:
    seen: set[str] = set()
    out = []
    for error in errors:
        if error.field not in seen:
            seen.add(error.field)
            out.append(error)
    return out


def job_template_errors(
    spec: JobSpec, *, required: bool, shared_namespace: bool = True, tenants: Collection[str] = ()
) -> list[FieldError]:
    """The templates' problems across a job, against the schema and, with ``shared_namespace`` (the
    pods admission itself makes, in a namespace tenants share), against what such a namespace allows;
    a user's own workload that admission adopted runs in the user's namespace with the user's rights,
    so that check is not for it. ``tenants``: the tenants known besides the job's, so that an object
    named for a longer tenant name (`team-b-data`, tenant `team`) counts as that tenant's. With ``required`` (admission runs workloads on a cluster), a pod
    group without a template is a problem: there is no image to run."""
    errors: list[FieldError] = []
    for index, group in enumerate(spec.pod_groups):
        prefix = f"pod_groups[{index}].template"
        if group.template is None:
            if required:
                errors.append(FieldError(field=prefix, reason="required: the pods' image and command to run"))
            continue
        shared = (
            shared_namespace_errors(group.template, prefix, spec.tenant, tenants) if shared_namespace else []
        )
        errors += _unique(template_errors(group.template, prefix) + shared)
    return errors
