"""The PredictiveAutoscaler as the controller reads it: errors that name the field, the HPA and the
ScaledObject it owns, and the status it writes (conditions keep their transition time while unchanged)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.forecaster.domain.autoscaler import InvalidSpec, hpa, parse, scaled_object
from tessera.forecaster.domain.autoscaler_status import Observed, status

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BASE: dict[str, Any] = {
    "apiVersion": "tessera.io/v1alpha1",
    "kind": "PredictiveAutoscaler",
    "metadata": {"name": "chat", "namespace": "serving", "uid": "u-1", "generation": 3},
    "spec": {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
        "maxReplicas": 20,
        "metric": {"type": "events", "events": {"name": "requests_per_s"}, "selector": {"app": "chat"}},
        "target": 12.5,
    },
}


def obj(**spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    out["spec"].update(spec)
    return out


def test_defaults_are_those_of_the_crd() -> None:
    pa = parse(BASE)
    assert (pa.min_replicas, pa.window_s, pa.mode, pa.via) == (1, 300, "Auto", "hpa")
    assert (pa.series_metric(), pa.series_selector()) == ("requests_per_s", {"app": "chat"})


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"maxReplicas": 0}, "spec.maxReplicas", "at least 1"),
        ({"minReplicas": 5, "maxReplicas": 2}, "spec.maxReplicas", "at least minReplicas"),
        ({"target": 0}, "spec.target", "positive"),
        ({"target": "lots"}, "spec.target", "number"),
        ({"mode": "Sometimes"}, "spec.mode", "Auto or Preview"),
        ({"via": "cron"}, "spec.via", "hpa or keda"),
        ({"metric": {"type": "cpu"}}, "spec.metric.type", "gpuUtilization, prometheus or events"),
        ({"metric": {"type": "prometheus"}}, "spec.metric.prometheus.query", "required"),
        ({"metric": {"type": "events", "events": {"name": "a b"}}}, "spec.metric.events.name", "metric name"),
        ({"scaleTargetRef": {"kind": "Deployment"}}, "spec.scaleTargetRef.name", "required"),
    ],
)
def test_a_bad_spec_names_the_field_and_the_reason(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse(obj(**spec))
    assert caught.value.field == field and words in str(caught.value)


def test_the_hpa_serves_the_total_forecast_over_the_target_per_replica() -> None:
    pa = parse(obj(minReplicas=0, predictionWindowSeconds=600))
    manifest = hpa(pa)
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    spec = manifest["spec"]
    assert spec["minReplicas"] == 1  # an HPA cannot go to zero; KEDA can
    (metric,) = spec["metrics"]
    assert metric["external"]["metric"]["selector"]["matchLabels"] == {"app": "chat", "window": "600"}
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "12500m"}


def test_a_prometheus_metric_reads_its_own_series_and_keda_gets_the_scaler_metadata() -> None:
    pa = parse(obj(via="keda", metric={"type": "prometheus", "prometheus": {"query": "sum(rate(x[1m]))"}}))
    assert (pa.series_metric(), pa.series_selector()) == ("prometheus", {"autoscaler": "serving.chat"})
    manifest = scaled_object(pa, "forecaster.tessera:9090")
    (trigger,) = manifest["spec"]["triggers"]
    assert trigger["metadata"] == {
        "scalerAddress": "forecaster.tessera:9090",
        "predictiveAutoscaler": "serving/chat",
        "metric": "prometheus",
        "selector": "autoscaler=serving.chat",
        "target": "12.5",
        "windowSeconds": "300",
    }
    assert manifest["spec"]["minReplicaCount"] == 1


def test_status_recommends_replicas_within_bounds_and_says_why() -> None:
    pa = parse(obj(maxReplicas=4))
    observed = Observed(value=30.0, expected=26.0, source="forecast", model="mean", recent_error=1.5)
    out = status(pa, observed, now=NOW)
    assert out["recommendedReplicas"] == 3 and out["forecast"] == 30.0 and out["model"] == "mean"
    assert out["reason"].startswith("forecast max over 300s (mean)")
    high = status(pa, Observed(value=500.0, source="forecast", model="mean"), now=NOW)
    assert high["recommendedReplicas"] == 4
    reactive = status(pa, Observed(value=1.0, source="reactive", reason="stale"), now=NOW)
    forecasting = next(c for c in reactive["conditions"] if c["type"] == "Forecasting")
    assert (forecasting["status"], forecasting["reason"]) == ("False", "Reactive")
    assert "stale" in forecasting["message"] and "last reading (stale)" in reactive["reason"]


def test_a_problem_is_not_ready_and_scales_nothing_and_transitions_keep_their_time() -> None:
    pa = parse(BASE)
    first = status(
        pa, Observed(problem=("TargetNotFound", "Deployment serving/chat does not exist")), now=NOW
    )
    ready = {c["type"]: c for c in first["conditions"]}
    assert (ready["Ready"]["status"], ready["Ready"]["reason"]) == ("False", "TargetNotFound")
    assert ready["Scaling"]["status"] == "False" and "recommendedReplicas" not in first
    later = NOW + timedelta(minutes=5)
    again = status(pa, Observed(problem=("TargetNotFound", "still")), now=later, previous=first["conditions"])
    assert {c["type"]: c["lastTransitionTime"] for c in again["conditions"]}[
        "Ready"
    ] == "2026-03-01T12:00:00Z"
    fixed = status(
        pa, Observed(value=1.0, source="forecast", model="m"), now=later, previous=again["conditions"]
    )
    assert {c["type"]: c["lastTransitionTime"] for c in fixed["conditions"]}[
        "Ready"
    ] == "2026-03-01T12:05:00Z"


def test_preview_says_so_in_scaling() -> None:
    out = status(parse(obj(mode="Preview")), Observed(value=1.0, source="forecast", model="m"), now=NOW)
    scaling = next(c for c in out["conditions"] if c["type"] == "Scaling")
    assert (scaling["status"], scaling["reason"]) == ("False", "Preview")
