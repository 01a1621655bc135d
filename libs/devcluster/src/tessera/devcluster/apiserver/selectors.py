"""Label and field selectors, parsed the way the Kubernetes API server parses them.

Label selectors support `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` and `!k`.
Field selectors support `path=v`, `path==v` and `path!=v` over dotted paths such as
`metadata.name`, `spec.nodeName` and `status.phase`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.devcluster.apiserver.errors import bad_request

_SET_REQUIREMENT = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")
_EQUALITY = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_./-]*)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # one of: =, !=, in, notin, exists, !exists
    values: tuple[str, ...] = ()

    def matches(self, value: str | None) -> bool:
        match self.operator:
            case "=":
                return value == self.values[0]
            case "!=":
                return value != self.values[0]
            case "in":
                return value is not None and value in self.values
            case "notin":
                return value is None or value not in self.values
            case "exists":
                return value is not None
            case "!exists":
                return value is None
        raise AssertionError(f"unknown operator {self.operator}")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in (p.strip() for p in parts) if part]


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text:
            return cls()
        requirements: list[Requirement] = []
        for part in _split_top_level(text):
            equality = _EQUALITY.match(part)
            if equality:
                key, op, value = equality.groups()
                requirements.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
                continue
            set_based = _SET_REQUIREMENT.match(part)
            if set_based is None:
                raise bad_request(f"unable to parse requirement: labelSelector {part!r} is not valid")
            negated, key, op, values = set_based.groups()
            if op:
                if negated:
                    raise bad_request(f"labelSelector {part!r}: '!' cannot be combined with {op}")
                items = tuple(v.strip() for v in values.split(",") if v.strip())
                requirements.append(Requirement(key, op, items))
            else:
                requirements.append(Requirement(key, "!exists" if negated else "exists"))
        return cls(tuple(requirements))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(req.matches(labels.get(req.key)) for req in self.requirements)

    @classmethod
    def from_match_labels(cls, match_labels: Mapping[str, str]) -> LabelSelector:
        return cls(tuple(Requirement(k, "=", (v,)) for k, v in sorted(match_labels.items())))


def _lookup(obj: Mapping[str, Any], path: str) -> str | None:
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if node is None:
        return None
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> FieldSelector:
        if not text:
            return cls()
        requirements: list[Requirement] = []
        for part in _split_top_level(text):
            equality = _EQUALITY.match(part)
            if equality is None:
                raise bad_request(f"invalid field selector {part!r}: expected path=value or path!=value")
            key, op, value = equality.groups()
            requirements.append(Requirement(key, "!=" if op == "!=" else "=", (value,)))
        return cls(tuple(requirements))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        # An absent field compares as the empty string, as it does for spec.nodeName in Kubernetes.
        return all(req.matches(_lookup(obj, req.key) or "") for req in self.requirements)


@dataclass(frozen=True)
class Selector:
    labels: LabelSelector = LabelSelector()
    fields: FieldSelector = FieldSelector()

    @classmethod
    def parse(cls, label_selector: str | None, field_selector: str | None) -> Selector:
        return cls(LabelSelector.parse(label_selector), FieldSelector.parse(field_selector))

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        metadata = obj.get("metadata") or {}
        return self.labels.matches(metadata.get("labels")) and self.fields.matches(obj)


__all__ = ["FieldSelector", "LabelSelector", "Requirement", "Selector"]
