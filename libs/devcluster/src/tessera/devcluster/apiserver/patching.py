"""The three PATCH flavours Kubernetes accepts: JSON patch, JSON merge patch, strategic merge patch.

The strategic merge patch here knows the merge keys of the lists our clients touch (containers by
name, conditions by type, taints by key, ...) and honours `$patch: delete|replace` and
`$deleteFromPrimitiveList`-free null deletion. Lists without a known merge key are replaced, which is
what the real server does for atomic lists.
"""

from __future__ import annotations

import copy
from typing import Any

from tessera.devcluster.apiserver.errors import bad_request, unsupported_media_type

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Merge keys of the lists that the strategic merge patch merges instead of replacing.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "ports": "containerPort",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "conditions": "type",
    "taints": "key",
    "addresses": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ownerReferences": "uid",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, list):
        return _strategic_list(target, patch, field)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
            continue
        merged = strategic_merge_patch(result.get(key), value, key)
        if merged is None and isinstance(value, dict) and value.get("$patch") == "delete":
            result.pop(key, None)
        else:
            result[key] = merged
    return result


def _strategic_list(target: Any, patch: list[Any], field: str) -> list[Any]:
    merge_key = MERGE_KEYS.get(field)
    if merge_key is None or not isinstance(target, list):
        return [item for item in copy.deepcopy(patch) if not _is_directive(item)]
    result: list[Any] = copy.deepcopy(target)
    for item in patch:
        if not isinstance(item, dict):
            raise bad_request(
                f"strategic merge patch: items of {field!r} must be objects keyed by {merge_key!r}"
            )
        if item.get("$patch") == "replace":
            return [i for i in copy.deepcopy(patch) if i.get("$patch") != "replace"]
        key = item.get(merge_key)
        index = next(
            (i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(merge_key) == key), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
            continue
        if index is None:
            result.append(copy.deepcopy(item))
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def _is_directive(item: Any) -> bool:
    return isinstance(item, dict) and set(item) == {"$patch"}


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch: path {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise bad_request(f"json patch: path {path!r} does not exist")
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise bad_request(f"json patch: path {path!r} does not exist")


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise bad_request(f"json patch: index in {path!r} is out of range")
    else:
        raise bad_request(f"json patch: cannot add at {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise bad_request("json patch: cannot remove the whole document")
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise bad_request(f"json patch: path {path!r} does not exist")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 over a deep copy of the target."""
    if not isinstance(operations, list):
        raise bad_request("json patch: the body must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"json patch: each operation needs 'op' and 'path', got {op!r}")
        kind, path = op["op"], op["path"]
        match kind:
            case "add":
                doc = _add(doc, path, copy.deepcopy(op.get("value")))
            case "remove":
                doc = _remove(doc, path)
            case "replace":
                _get(doc, path)
                doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value")))
            case "move":
                value = _get(doc, op["from"])
                doc = _add(_remove(doc, op["from"]), path, value)
            case "copy":
                doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
            case "test":
                if _get(doc, path) != op.get("value"):
                    raise bad_request(f"json patch: test failed at {path!r}")
            case _:
                raise bad_request(f"json patch: unknown op {kind!r}")
    return doc


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    media = content_type.split(";")[0].strip().lower()
    if media == JSON_PATCH:
        result = json_patch(target, patch)
    elif media == MERGE_PATCH:
        result = merge_patch(target, _require_object(patch))
    elif media in (STRATEGIC_MERGE_PATCH, "application/json", ""):
        result = strategic_merge_patch(target, _require_object(patch))
    elif media == APPLY_PATCH:
        raise unsupported_media_type(
            "server-side apply of a subresource is not supported by the devcluster; use a merge patch"
        )
    else:
        raise unsupported_media_type(f"the patch Content-Type {content_type!r} is not supported")
    if not isinstance(result, dict):
        raise bad_request("the patched object must stay a JSON object")
    return result


def _require_object(patch: Any) -> dict[str, Any]:
    if not isinstance(patch, dict):
        raise bad_request("a merge patch body must be a JSON object")
    return patch
