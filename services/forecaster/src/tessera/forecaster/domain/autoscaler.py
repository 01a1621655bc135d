"""The PredictiveAutoscaler (`tessera.io/v1alpha1`): its spec read with errors that name the field, the
objects it owns (an `autoscaling/v2` HPA on the forecast as an External metric, or a KEDA ScaledObject on
the forecaster's external scaler) and the status it shows. Pure: the controller reads and writes them."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

GROUP, VERSION, PLURAL, KIND = "tessera.io", "v1alpha1", "predictiveautoscalers", "PredictiveAutoscaler"
API_VERSION = f"{GROUP}/{VERSION}"
MANAGED_BY = "app.kubernetes.io/managed-by"
CONTROLLER = "tessera-forecaster"
#: the series a `prometheus` metric's readings are recorded under (one per autoscaler)
PROMETHEUS_METRIC = "prometheus"
AUTOSCALER_LABEL = "autoscaler"
#: a gpuUtilization metric is served under this name (the forecaster's metric names map it)
GPU_UTILIZATION = "gpuUtilization"
#: the HPA's scale-down window: short, because the served value already defers scale-down
HPA_SCALE_DOWN_WINDOW_S = 60

Mode = Literal["Auto", "Preview"]
Via = Literal["hpa", "keda"]
MetricType = Literal["gpuUtilization", "prometheus", "events"]
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:.-]*$")


class InvalidSpec(ValueError):
    """A PredictiveAutoscaler whose spec cannot be acted on: `field` names where, the message why."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"spec.{field_path}: {reason}")
        self.field = f"spec.{field_path}"
        self.reason = reason


@dataclass(frozen=True)
class TargetRef:
    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class MetricSpec:
    type: MetricType
    selector: Mapping[str, str] = field(default_factory=dict)
    query: str | None = None
    """the PromQL query of a `prometheus` metric"""
    event_name: str | None = None
    """the record_metric name of an `events` metric"""


@dataclass(frozen=True)
class AutoscalerSpec:
    namespace: str
    name: str
    uid: str
    generation: int
    target_ref: TargetRef
    min_replicas: int
    max_replicas: int
    metric: MetricSpec
    target: float
    window_s: int
    mode: Mode
    via: Via

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def series_metric(self) -> str:
        """The metric name the forecaster serves this autoscaler's value under."""
        if self.metric.type == "gpuUtilization":
            return GPU_UTILIZATION
        if self.metric.type == "events":
            assert self.metric.event_name is not None
            return self.metric.event_name
        return PROMETHEUS_METRIC

    def series_selector(self) -> dict[str, str]:
        """The labels of the series it reads (a `prometheus` metric's series is its own)."""
        if self.metric.type == "prometheus":
            return {AUTOSCALER_LABEL: f"{self.namespace}.{self.name}"}
        return dict(self.metric.selector)


def _int(spec: Mapping[str, Any], key: str, default: int | None, minimum: int) -> int:
    raw = spec.get(key, default)
    if raw is None:
        raise InvalidSpec(key, "is required")
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise InvalidSpec(key, f"must be an integer, not {raw!r}")
    if raw < minimum:
        raise InvalidSpec(key, f"must be at least {minimum}, not {raw}")
    return raw


def _str(spec: Mapping[str, Any], key: str, path: str) -> str:
    raw = spec.get(key)
    if not isinstance(raw, str) or not raw:
        raise InvalidSpec(path, "is required (a non-empty string)")
    return raw


def _metric(raw: Any) -> MetricSpec:
    if not isinstance(raw, Mapping):
        raise InvalidSpec("metric", "is required (an object with a type)")
    kind = raw.get("type")
    selector = raw.get("selector") or {}
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise InvalidSpec("metric.selector", "must map label names to strings")
    if kind == "gpuUtilization":
        return MetricSpec("gpuUtilization", dict(selector))
    if kind == "prometheus":
        query = _str(raw.get("prometheus") or {}, "query", "metric.prometheus.query")
        return MetricSpec("prometheus", dict(selector), query=query)
    if kind == "events":
        name = _str(raw.get("events") or {}, "name", "metric.events.name")
        if not _METRIC_NAME.match(name):
            raise InvalidSpec("metric.events.name", f"{name!r} is not a metric name")
        return MetricSpec("events", dict(selector), event_name=name)
    raise InvalidSpec("metric.type", f"must be gpuUtilization, prometheus or events, not {kind!r}")


def parse(obj: Mapping[str, Any]) -> AutoscalerSpec:
    """A PredictiveAutoscaler object as the API serves it; defaults as the CRD's schema sets them."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidSpec("", "is required")
    ref = spec.get("scaleTargetRef")
    if not isinstance(ref, Mapping):
        raise InvalidSpec("scaleTargetRef", "is required (kind and name)")
    target_ref = TargetRef(
        str(ref.get("apiVersion") or "apps/v1"),
        _str(ref, "kind", "scaleTargetRef.kind"),
        _str(ref, "name", "scaleTargetRef.name"),
    )
    min_replicas = _int(spec, "minReplicas", 1, 0)
    max_replicas = _int(spec, "maxReplicas", None, 1)
    if max_replicas < min_replicas:
        raise InvalidSpec("maxReplicas", f"must be at least minReplicas ({min_replicas}), not {max_replicas}")
    target = spec.get("target")
    if isinstance(target, bool) or not isinstance(target, int | float) or not math.isfinite(target):
        raise InvalidSpec("target", f"must be a number, not {target!r}")
    if target <= 0:
        raise InvalidSpec("target", f"must be positive, not {target}")
    mode = spec.get("mode", "Auto")
    if mode not in ("Auto", "Preview"):
        raise InvalidSpec("mode", f"must be Auto or Preview, not {mode!r}")
    via = spec.get("via", "hpa")
    if via not in ("hpa", "keda"):
        raise InvalidSpec("via", f"must be hpa or keda, not {via!r}")
    return AutoscalerSpec(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        generation=int(meta.get("generation") or 0),
        target_ref=target_ref,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        metric=_metric(spec.get("metric")),
        target=float(target),
        window_s=_int(spec, "predictionWindowSeconds", 300, 1),
        mode=mode,
        via=via,
    )


def owner_reference(pa: AutoscalerSpec) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": pa.name,
        "uid": pa.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(pa: AutoscalerSpec) -> dict[str, Any]:
    return {
        "name": pa.name,
        "namespace": pa.namespace,
        "labels": {MANAGED_BY: CONTROLLER},
        "ownerReferences": [owner_reference(pa)],
    }


def selector_text(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


#: decimal SI suffixes by power of ten, as the API server writes quantities
_SI_SUFFIXES = {-3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}


def quantity(value: float) -> str:
    """A Kubernetes quantity to the milli-unit, in the canonical form the API server stores it in (the
    largest power of a thousand that leaves a whole number: `12500m`, `10`, `1500`, `2k`, `1M`), so the
    HPA read back compares equal to the one written."""
    amount, exponent = round(value * 1000), -3
    if amount == 0:
        return "0"
    while amount % 10 == 0 and exponent < 18:
        amount, exponent = amount // 10, exponent + 1
    while exponent % 3:
        amount, exponent = amount * 10, exponent - 1
    return f"{amount}{_SI_SUFFIXES[exponent]}"


def hpa(pa: AutoscalerSpec) -> dict[str, Any]:
    """The HPA it owns: the forecast, as an External metric whose value is the total load, over a target
    average per replica, so the HPA's `ceil(value / target)` is the replicas the forecast needs."""
    match_labels = {**pa.series_selector(), "window": str(pa.window_s)}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(pa),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": pa.target_ref.api_version,
                "kind": pa.target_ref.kind,
                "name": pa.target_ref.name,
            },
            "minReplicas": max(1, pa.min_replicas),
            "maxReplicas": pa.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": pa.series_metric(), "selector": {"matchLabels": match_labels}},
                        "target": {"type": "AverageValue", "averageValue": quantity(pa.target)},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": HPA_SCALE_DOWN_WINDOW_S}},
        },
    }


def scaled_object(pa: AutoscalerSpec, scaler_address: str) -> dict[str, Any]:
    """The KEDA ScaledObject it owns: an `external` trigger naming it, asking the forecaster's scaler."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": _metadata(pa),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": pa.target_ref.api_version,
                "kind": pa.target_ref.kind,
                "name": pa.target_ref.name,
            },
            "minReplicaCount": pa.min_replicas,
            "maxReplicaCount": pa.max_replicas,
            "triggers": [
                {
                    "type": "external",
                    "metadata": {
                        "scalerAddress": scaler_address,
                        "predictiveAutoscaler": pa.key,
                        "metric": pa.series_metric(),
                        "selector": selector_text(pa.series_selector()),
                        "target": str(pa.target),
                        "windowSeconds": str(pa.window_s),
                    },
                }
            ],
        },
    }
