"""Required node affinity: `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution`.
Pure.

As kube-scheduler reads it: a node fits when ANY of the `nodeSelectorTerms` matches, and a term
matches when ALL of its `matchExpressions` (on the node's labels) and `matchFields` (only
`metadata.name`, as upstream) hold. Operators: In, NotIn, Exists, DoesNotExist, Gt, Lt (integers). No
terms: every node fits. A term with no expressions matches no node, as upstream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
NODE_NAME_FIELD = "metadata.name"


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()
    #: a matchFields requirement (on the node's name) rather than a label
    field: bool = False

    def holds(self, labels: Mapping[str, str], node_name: str) -> bool:
        present = True if self.field else self.key in labels
        value = node_name if self.field else labels.get(self.key, "")
        match self.operator:
            case "In":
                return present and value in self.values
            case "NotIn":
                return not present or value not in self.values
            case "Exists":
                return present
            case "DoesNotExist":
                return not present
            case "Gt" | "Lt":
                if not present:
                    return False
                try:
                    number, bound = int(value), int(self.values[0])
                except ValueError:
                    return False
                return number > bound if self.operator == "Gt" else number < bound
        return False


NodeSelectorTerm = tuple[NodeSelectorRequirement, ...]


def affinity_matches(terms: Sequence[NodeSelectorTerm], labels: Mapping[str, str], node_name: str) -> bool:
    """Whether a node with ``labels`` named ``node_name`` fits the required terms."""
    if not terms:
        return True
    return any(term and all(r.holds(labels, node_name) for r in term) for term in terms)


def parse_required_affinity(spec: Mapping[str, Any], where: str = "spec") -> tuple[NodeSelectorTerm, ...]:
    """The required node selector terms of a pod spec; raises ValueError naming the field."""
    path = f"{where}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    raw_terms = required.get("nodeSelectorTerms") or []
    if not isinstance(raw_terms, list):
        raise ValueError(f"{path}.nodeSelectorTerms: expected a list")
    terms: list[NodeSelectorTerm] = []
    for i, term in enumerate(raw_terms):
        at = f"{path}.nodeSelectorTerms[{i}]"
        found: list[NodeSelectorRequirement] = []
        for part, is_field in (("matchExpressions", False), ("matchFields", True)):
            for j, expr in enumerate((term or {}).get(part) or []):
                found.append(_requirement(expr, f"{at}.{part}[{j}]", is_field))
        terms.append(tuple(found))
    return tuple(terms)


def _requirement(expr: Mapping[str, Any], at: str, is_field: bool) -> NodeSelectorRequirement:
    key, operator = str(expr.get("key") or ""), str(expr.get("operator") or "")
    values = tuple(str(v) for v in expr.get("values") or ())
    if not key:
        raise ValueError(f"{at}.key: required")
    if operator not in OPERATORS:
        raise ValueError(f"{at}.operator: expected one of {', '.join(OPERATORS)}, got {operator!r}")
    if is_field and (key != NODE_NAME_FIELD or operator not in ("In", "NotIn")):
        raise ValueError(f"{at}: only {NODE_NAME_FIELD} with In or NotIn is supported")
    if operator in ("In", "NotIn") and not values:
        raise ValueError(f"{at}.values: required for {operator}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise ValueError(f"{at}.values: must be empty for {operator}")
    if operator in ("Gt", "Lt") and (len(values) != 1 or not values[0].lstrip("-").isdigit()):
        raise ValueError(f"{at}.values: {operator} takes one integer")
    return NodeSelectorRequirement(key, operator, values, is_field)
