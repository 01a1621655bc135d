"""HTTP: the Kubernetes external metrics API (`external.metrics.k8s.io/v1beta1`, as an APIService's
backend serves it to the HPA) and the forecaster's own view of its series."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request

from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.metric_names import MetricRef, parse_selector
from tessera.forecaster.service_layer.queries import metric_value

metrics_router = APIRouter()
"""the external metrics API alone: what the HTTPS server for the APIService serves"""
GROUP_VERSION = "external.metrics.k8s.io/v1beta1"


def _deps(request: Request) -> ForecasterDeps:
    deps: ForecasterDeps = request.app.state.deps
    return deps


@metrics_router.get("/apis/external.metrics.k8s.io/v1beta1", tags=["external metrics"])
async def api_resources() -> dict[str, Any]:
    """The discovery document the aggregation layer asks for."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            {
                "name": "*",
                "singularName": "",
                "namespaced": True,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            }
        ],
    }


@metrics_router.get(
    "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}", tags=["external metrics"]
)
async def external_metric(
    request: Request, namespace: str, metric: str, label_selector: str = Query("", alias="labelSelector")
) -> dict[str, Any]:
    """The served value of `metric` (a series' metric name) over the series the selector matches. The
    selector's `window` label, when present, is the prediction window in seconds."""
    deps = _deps(request)
    try:
        selector = parse_selector(label_selector)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc
    ref = MetricRef.from_selector(metric, selector, deps.default_window_s)
    now = deps.clock()
    async with deps.uow() as uow:
        value = await metric_value(uow, ref.series_metric, ref.selector, now=now, window_s=ref.window_s)
    if not value.found:
        raise HTTPException(404, f"no series of metric {ref.series_metric!r} matches {ref.selector}")
    return {
        "kind": "ExternalMetricValueList",
        "apiVersion": GROUP_VERSION,
        "metadata": {},
        "items": [
            {
                "metricName": metric,
                "metricLabels": {
                    **selector,
                    "tessera.io/source": value.source,
                    **({"tessera.io/models": ",".join(value.models)} if value.models else {}),
                },
                "timestamp": now.isoformat().replace("+00:00", "Z"),
                "windowSeconds": int(ref.window_s),
                "value": quantity(value.value),
            }
        ],
    }


def quantity(value: float) -> str:
    """A Kubernetes quantity in milli-units (`1500m`), as metrics servers write fractional values."""
    return f"{round(max(value, 0.0) * 1000)}m"


router = APIRouter()
"""the service's plain HTTP routes: the external metrics API and the forecaster's view of its series"""
router.include_router(metrics_router)


@router.get("/v1/series", tags=["forecasts"])
async def list_series(request: Request) -> list[dict[str, Any]]:
    deps = _deps(request)
    now = deps.clock()
    out = []
    async with deps.uow() as uow:
        for s in await uow.series.all():
            model = await uow.models.get(s.id)
            value = await metric_value(
                uow, s.key.metric, dict(s.key.labels), now=now, window_s=deps.default_window_s
            )
            out.append(
                {
                    "series": str(s.key),
                    "model": model.chosen if model else None,
                    "scores": model.scores if model else {},
                    "served": value.value,
                    "expected": value.expected,
                    "source": value.source,
                    "reason": value.reason,
                }
            )
    return out
