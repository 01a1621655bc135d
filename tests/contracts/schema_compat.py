"""Backward compatibility of JSON Schemas: what a consumer of the pinned version relies on must still hold."""

from __future__ import annotations

from typing import Any


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref:
        name = ref.rsplit("/", 1)[-1]
        return dict(root.get("$defs", {})[name])
    return schema


def _types(schema: dict[str, Any], root: dict[str, Any]) -> set[str]:
    schema = _resolve(schema, root)
    if "anyOf" in schema:
        return set().union(*(_types(s, root) for s in schema["anyOf"]))
    if "type" in schema:
        return {schema["type"]} if isinstance(schema["type"], str) else set(schema["type"])
    if "enum" in schema:
        return {"enum"}
    return {"object"} if "properties" in schema else {"any"}


def breaking_changes(
    old: dict[str, Any], new: dict[str, Any], path: str = "", *, old_root: Any = None, new_root: Any = None
) -> list[str]:
    """Every way `new` breaks a reader or writer of `old`: removed or retyped fields, new required fields."""
    old_root = old_root or old
    new_root = new_root or new
    old, new = _resolve(old, old_root), _resolve(new, new_root)
    problems = []
    if not _types(old, old_root) <= _types(new, new_root) | {"any"}:
        problems.append(
            f"{path or '(root)'}: type {sorted(_types(old, old_root))} became {sorted(_types(new, new_root))}"
        )
    for name, old_prop in old.get("properties", {}).items():
        new_prop = new.get("properties", {}).get(name)
        if new_prop is None:
            problems.append(f"{path}.{name}: removed")
            continue
        problems += breaking_changes(
            old_prop, new_prop, f"{path}.{name}", old_root=old_root, new_root=new_root
        )
    added_required = set(new.get("required", [])) - set(old.get("required", []))
    problems += [f"{path}.{name}: newly required" for name in sorted(added_required)]
    if "enum" in old and not set(old["enum"]) <= set(new.get("enum", old["enum"])):
        problems.append(f"{path}: enum values removed")
    return problems
