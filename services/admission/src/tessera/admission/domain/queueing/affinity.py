"""What a pod group's pods require of a node: the pod template's `nodeSelector` and required node
affinity. Pure.

Two checks use it, as Kueue's flavor assigner and kube-scheduler do:
- **Flavors.** A flavor whose node labels contradict the requirement can never hold the pods. As in
  Kueue, only the label keys the flavors name are compared (a flavor says nothing of the others):
  a `nodeSelector` entry on such a key must be the flavor's value, and a required affinity term is
  read with only its expressions on such keys (a term left with none matches any flavor). A flavor's
  GPU model stands for the GPU product label (`nvidia.com/gpu.product`) its nodes carry.
- **Nodes.** A node whose labels do not match the requirement cannot hold the pods, whatever is
  free on it (the requirement as the scheduler reads it, `tessera.cluster.domain.affinity`, on the
  label keys the node's source reports: a key it does not report is not held against the node).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from tessera.cluster.catalogue.models import normalise_model_name, resolve_product
from tessera.cluster.conventions.names import GPU_PRODUCT_LABEL
from tessera.cluster.domain.affinity import (
    NodeSelectorRequirement,
    NodeSelectorTerm,
    parse_required_affinity,
)


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """`selector`: the nodeSelector's (key, value) pairs; `terms`: the required node affinity's terms
    (a node matches any one). Empty: any node."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[NodeSelectorTerm, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.selector or self.terms)

    def may_match_node(self, labels: Mapping[str, str], name: str = "") -> bool:
        """Whether a node whose source reports ``labels`` may hold the pods, comparing only the label
        keys it reports: a source (a cluster file, telemetry's inventory) may report some of a node's
        labels and not others (`kubernetes.io/os`), and a requirement on a key it does not report is
        left to the scheduler, which sees every label, rather than declared unmeetable."""
        if any(key in labels and labels[key] != value for key, value in self.selector):
            return False
        if not self.terms:
            return True
        for term in self.terms:
            if all(r.holds(labels, name) for r in term if r.field or r.key in labels):
                return True
        return False

    def allows_flavor(
        self, node_labels: Mapping[str, str], keys: Collection[str], gpu_model: str | None = None
    ) -> bool:
        """Whether the nodes of a flavor labelled ``node_labels`` may hold the pods, comparing only
        the label ``keys`` the flavors name (Kueue's rule). A flavor of a ``gpu_model`` that names no
        `nvidia.com/gpu.product` label also answers for that label: the products a requirement names
        (`NVIDIA-H100-80GB-HBM3`, `H100`) must include one of its model."""
        product = gpu_model is not None and GPU_PRODUCT_LABEL not in node_labels
        for key, value in self.selector:
            if product and key == GPU_PRODUCT_LABEL:
                if not _same_model(value, gpu_model):
                    return False
            elif key in keys and node_labels.get(key) != value:
                return False
        if not self.terms:
            return True
        for term in self.terms:
            held = [
                _product_holds(r, gpu_model)
                if product and r.key == GPU_PRODUCT_LABEL
                else r.holds(node_labels, "")
                for r in term
                if not r.field and (r.key in keys or (product and r.key == GPU_PRODUCT_LABEL))
            ]
            if all(held):  # a term with nothing to compare matches any flavor
                return True
        return False

    def describe(self) -> str:
        """As a user wrote it: `gpu.product In [H100]; zone=rack-a` (terms joined by `or`)."""
        parts = [f"{key}={value}" for key, value in self.selector]
        if self.terms:
            parts.append(
                " or ".join(", ".join(_requirement(r) for r in term) or "(empty term)" for term in self.terms)
            )
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """JSON-friendly, for the job's stored queueing view; `stored` reads it back."""
        return {
            "nodeSelector": dict(self.selector),
            "terms": [
                [
                    {"key": r.key, "operator": r.operator, "values": list(r.values), "field": r.field}
                    for r in term
                ]
                for term in self.terms
            ],
        }

    @classmethod
    def of_pod_spec(cls, spec: Mapping[str, Any]) -> NodeRequirement:
        """A pod spec's requirement; raises ValueError naming the field of a malformed affinity."""
        selector = spec.get("nodeSelector") or {}
        if not isinstance(selector, Mapping):
            raise ValueError("spec.nodeSelector: expected a map")
        pairs = tuple(sorted((str(k), str(v)) for k, v in selector.items()))
        return cls(pairs, parse_required_affinity(spec))

    @classmethod
    def of_template(cls, template: Mapping[str, Any] | None) -> NodeRequirement:
        """A pod template's requirement; none for a template without a spec, or whose affinity cannot
        be read (template validation names that problem, and the scheduler refuses such pods)."""
        spec = (template or {}).get("spec")
        if not isinstance(spec, Mapping):
            return cls()
        try:
            return cls.of_pod_spec(spec)
        except (ValueError, TypeError, AttributeError):
            return cls()

    @classmethod
    def stored(cls, raw: Any) -> NodeRequirement:
        """Read back `to_json`; none for anything else (a job stored before requirements were)."""
        if not isinstance(raw, Mapping):
            return cls()
        selector = raw.get("nodeSelector") or {}
        terms = raw.get("terms") or []
        try:
            return cls(
                tuple(sorted((str(k), str(v)) for k, v in selector.items())),
                tuple(
                    tuple(
                        NodeSelectorRequirement(
                            str(r["key"]),
                            str(r["operator"]),
                            tuple(str(v) for v in r.get("values") or ()),
                            bool(r.get("field")),
                        )
                        for r in term
                    )
                    for term in terms
                ),
            )
        except (KeyError, TypeError, AttributeError):
            return cls()


ANY_NODE = NodeRequirement()
"""What pods that ask nothing of their node require."""


def flavor_label_keys(node_labels: Collection[Mapping[str, str]]) -> frozenset[str]:
    """Every label key the flavors' node labels name: the keys a requirement is compared on."""
    return frozenset(key for labels in node_labels for key in labels)


def _same_model(product: str, gpu_model: str | None) -> bool:
    model = resolve_product(product).name
    return (
        gpu_model is not None
        and normalise_model_name(model).lower() == normalise_model_name(gpu_model).lower()
    )


def _product_holds(r: NodeSelectorRequirement, gpu_model: str | None) -> bool:
    """A requirement on the GPU product label, of a flavor known only by its GPU model: `In` holds when
    a product named is of the model, `DoesNotExist` never; the rest (a product of the model may be
    excluded by `NotIn` while another is not) are left to the nodes."""
    if r.operator == "In":
        return any(_same_model(v, gpu_model) for v in r.values)
    return r.operator != "DoesNotExist"


def _requirement(r: NodeSelectorRequirement) -> str:
    if r.operator in ("Exists", "DoesNotExist"):
        return f"{r.key} {r.operator}"
    if r.operator in ("Gt", "Lt"):
        return f"{r.key} {r.operator} {r.values[0] if r.values else ''}".rstrip()
    return f"{r.key} {r.operator} [{', '.join(r.values)}]"
