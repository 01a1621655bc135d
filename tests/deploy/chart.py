"""Rendering the Helm chart in-process with helm-python-sdk (Helm's Go SDK; no helm binary)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

from tests.deploy.chart_schema import CHART

VALUES = Path(__file__).parent / "values"
RELEASE, NAMESPACE = "tessera", "tessera"
SERVICES = ("telemetry", "forecaster", "admission", "scheduler", "slicing", "checkpoint")


def values_file(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((VALUES / name).read_text()) or {}
    return loaded


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win, maps merge (as several `-f` files do)."""
    result: dict[str, Any] = {}
    for layer in layers:
        result = _merge(result, layer)
    return result


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# The value sets every check runs over.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": values_file("production.yaml"),
    "evaluation": {"evaluation": {"enabled": True}},
    "ha": merged(values_file("production.yaml"), values_file("ha.yaml")),
    "half-disabled": merged(values_file("production.yaml"), values_file("half-disabled.yaml")),
    "cert-manager": merged(values_file("production.yaml"), values_file("cert-manager.yaml")),
}


@dataclass(frozen=True)
class Rendered:
    values: dict[str, Any]
    """The values the chart used: its defaults coalesced with the value set."""
    objects: list[dict[str, Any]]
    crds: list[dict[str, Any]]

    def of_kind(self, *kinds: str) -> list[dict[str, Any]]:
        return [obj for obj in self.objects if obj["kind"] in kinds]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [obj for obj in self.of_kind(kind) if obj["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def enabled(self) -> list[str]:
        return [service for service in SERVICES if self.values[service]["enabled"]]

    def pod_templates(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """(workload, pod spec) of every Deployment, DaemonSet, StatefulSet and Job."""
        for obj in self.of_kind("Deployment", "DaemonSet", "StatefulSet", "Job"):
            yield obj, obj["spec"]["template"]["spec"]


def render(values: dict[str, Any]) -> Rendered:
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        coalesced = chart.merge_values(values)
        crds = [yaml.safe_load(crd["data"]) for crd in chart.crds]
    objects = [
        doc
        for path, text in sorted(manifests.items())
        if not path.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]
    return Rendered(coalesced, objects, crds)


def notes(values: dict[str, Any]) -> str:
    with helm_python.Chart.load(CHART) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def workloads(chart: Rendered) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(service, workload, its container) of every enabled service."""
    for service in chart.enabled():
        kind = "DaemonSet" if service == "telemetry" else "Deployment"
        workload = chart.get(kind, f"tessera-{service}")
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        yield service, workload, container
