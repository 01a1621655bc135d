"""A minimal OpenAPI v3 surface: enough for kubectl to learn that the server validates fields itself.

`kubectl create/apply` validate a manifest against the OpenAPI schema unless the server supports
the `fieldValidation` query parameter, which kubectl finds in the PATCH operations of
`/openapi/v3/<group-version>`. We publish those operations (with the group-version-kind extension
kubectl looks for) and no schemas, so kubectl leaves validation to the server.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tessera.devcluster.apiserver.resources import ResourceRegistry, ResourceType


def group_version_path(rtype: ResourceType) -> str:
    return f"api/{rtype.version}" if not rtype.group else f"apis/{rtype.group}/{rtype.version}"


def _item_path(rtype: ResourceType) -> str:
    prefix = f"/{group_version_path(rtype)}"
    if rtype.namespaced:
        return f"{prefix}/namespaces/{{namespace}}/{rtype.plural}/{{name}}"
    return f"{prefix}/{rtype.plural}/{{name}}"


def _operation(rtype: ResourceType, verb: str) -> dict[str, Any]:
    return {
        "operationId": f"{verb}{rtype.kind}",
        "x-kubernetes-action": verb,
        "x-kubernetes-group-version-kind": {
            "group": rtype.group,
            "version": rtype.version,
            "kind": rtype.kind,
        },
        "parameters": [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
        ],
        "responses": {"200": {"description": "OK"}},
    }


def group_version_document(registry: ResourceRegistry, path: str) -> dict[str, Any] | None:
    types = [t for t in registry if group_version_path(t) == path and "patch" in t.verbs]
    if not types:
        return None
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.31.0"},
        "paths": {
            _item_path(t): {"patch": _operation(t, "patch"), "put": _operation(t, "put")} for t in types
        },
        "components": {"schemas": {}},
    }


def root_document(registry: ResourceRegistry) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for path in sorted({group_version_path(t) for t in registry}):
        document = group_version_document(registry, path)
        if document is None:
            continue
        digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32].upper()
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
