"""What the controller's `apply` counts as drift in the HPA or ScaledObject it owns: only a field it sets.
A real API server defaults the rest of an HPA's `behavior` and writes quantities canonically; neither may
make the controller replace its HPA every pass."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tessera.forecaster.adapters.kube_autoscalers import HPA, KubeAutoscalers, NotOwned
from tessera.forecaster.domain.autoscaler import hpa, parse, quantity, scaled_object

SCALED_OBJECT = ("keda.sh", "v1alpha1", "scaledobjects")
PA = parse(
    {
        "metadata": {"name": "chat", "namespace": "default", "uid": "u1"},
        "spec": {
            "scaleTargetRef": {"kind": "Deployment", "name": "chat"},
            "maxReplicas": 20,
            "target": 10,
            "metric": {"type": "gpuUtilization"},
        },
    }
)
#: kube-apiserver's SetDefaults_HorizontalPodAutoscalerBehavior for a behavior naming only the
#: scale-down window (autoscaling/v2)
SERVER_BEHAVIOR = {
    "scaleDown": {
        "stabilizationWindowSeconds": 60,
        "selectPolicy": "Max",
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
    },
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": 4, "periodSeconds": 15},
            {"type": "Percent", "value": 100, "periodSeconds": 15},
        ],
    },
}


class Stored(KubeAutoscalers):
    """The adapter over one stored object, recording what it writes (no API server)."""

    def __init__(self, stored: dict[str, Any] | None) -> None:
        self.stored = stored
        self.writes: list[tuple[str, dict[str, Any]]] = []

    def _get(self, gvp: tuple[str, str, str], namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.stored)

    def _create(self, gvp: tuple[str, str, str], namespace: str, body: dict[str, Any]) -> None:
        self.writes.append(("create", body))
        self.stored = copy.deepcopy(body)

    def _replace(self, gvp: tuple[str, str, str], namespace: str, name: str, body: dict[str, Any]) -> None:
        self.writes.append(("replace", body))
        self.stored = copy.deepcopy(body)


def as_a_server_stores_it(desired: dict[str, Any]) -> dict[str, Any]:
    stored = copy.deepcopy(desired)
    stored["metadata"].update(resourceVersion="7", uid="hpa-uid", creationTimestamp="2026-11-24T00:00:00Z")
    stored["spec"]["behavior"] = copy.deepcopy(SERVER_BEHAVIOR)
    stored["status"] = {"currentReplicas": 3, "desiredReplicas": 3}
    return stored


def test_the_server_defaults_of_an_hpa_are_no_drift() -> None:
    cluster = Stored(as_a_server_stores_it(hpa(PA)))
    assert [cluster.apply(HPA, hpa(PA), "u1") for _ in range(3)] == ["unchanged"] * 3
    assert cluster.writes == []


def test_a_changed_field_it_owns_is_written_back() -> None:
    stored = as_a_server_stores_it(hpa(PA))
    stored["spec"]["maxReplicas"] = 5  # someone edited it
    cluster = Stored(stored)
    assert cluster.apply(HPA, hpa(PA), "u1") == "updated"
    ((kind, body),) = cluster.writes
    assert kind == "replace" and body["spec"] == hpa(PA)["spec"]
    assert body["metadata"]["resourceVersion"] == "7"  # a replace of what it read, not a blind write

    # a nested owned field (the scale-down window) and a list (the metrics) count too
    changes: list[Callable[[dict[str, Any]], object]] = [
        lambda s: s["behavior"]["scaleDown"].update(stabilizationWindowSeconds=300),
        lambda s: s["metrics"][0]["external"]["metric"]["selector"]["matchLabels"].update(window="60"),
        lambda s: s["metrics"].append({"type": "Resource", "resource": {"name": "cpu"}}),
        lambda s: s.pop("behavior"),
    ]
    for change in changes:
        stored = as_a_server_stores_it(hpa(PA))
        change(stored["spec"])
        assert Stored(stored).apply(HPA, hpa(PA), "u1") == "updated"


def test_a_scaled_object_with_fields_keda_adds_is_unchanged_and_one_it_does_not_own_is_left_alone() -> None:
    desired = scaled_object(PA, "forecaster:9090")
    stored = copy.deepcopy(desired)
    stored["spec"]["advanced"] = {"restoreToOriginalReplicaCount": False}
    cluster = Stored(stored)
    assert cluster.apply(SCALED_OBJECT, desired, "u1") == "unchanged"
    stored["spec"]["triggers"][0]["metadata"]["target"] = "3"
    assert cluster.apply(SCALED_OBJECT, desired, "u1") == "updated"
    with pytest.raises(NotOwned):
        Stored(stored).apply(SCALED_OBJECT, desired, "someone-else")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (10, "10"),
        (12.5, "12500m"),
        (0.1, "100m"),
        (1500, "1500"),
        (1000, "1k"),
        (2000000, "2M"),
        (1.0001, "1"),
        (0, "0"),
    ],
)
def test_a_target_is_written_as_the_server_writes_its_quantity(value: float, text: str) -> None:
    """`resource.Quantity`'s canonical form: otherwise a target of 1000 read back as `1k` is drift."""
    assert quantity(value) == text
