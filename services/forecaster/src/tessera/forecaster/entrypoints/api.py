"""HTTP: the Kubernetes external metrics API (`external.metrics.k8s.io/v1beta1`, as an APIService's
backend serves it to the HPA) and the forecaster's own view of its series.

A request names a namespace (the HPA's, or the ScaledObject's for KEDA's scaler) and sees only what that
namespace may: a PredictiveAutoscaler's own series (its `autoscaler` label, `<namespace>.<name>`) is seen
from its namespace alone, so a selector naming another namespace's autoscaler matches nothing and an
empty selector sums the namespace's own series. Series no autoscaler owns (`gpu_busy` per shape,
applications' recorded metrics) carry no namespace and are the cluster's.

`GET /v1/series` lists series the same way for a tenant, whose namespace is its name (as admission
takes a labelled Job's namespace for its tenant): its bearer token is checked with admission
(`tessera.core.tenant_tokens`, as telemetry's usage API checks it) and the tenant sees what a request in
its namespace would; the admin token sees every namespace's; `auth=disabled` (the local stack) too."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request

from tessera.core.tenant_tokens import AUTH_RESPONSES
from tessera.forecaster.adapters.repository import SeriesRepository
from tessera.forecaster.domain.autoscaler import AUTOSCALER_LABEL
from tessera.forecaster.domain.model import Series
from tessera.forecaster.domain.series import Aggregation, SeriesKey
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.metric_names import MetricRef, parse_selector
from tessera.forecaster.service_layer.queries import MetricValue, metric_value
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork

metrics_router = APIRouter()
"""the external metrics API alone: what the HTTPS server for the APIService serves"""
GROUP_VERSION = "external.metrics.k8s.io/v1beta1"


def _deps(request: Request) -> ForecasterDeps:
    deps: ForecasterDeps = request.app.state.deps
    return deps


def visible_from(namespace: str, key: SeriesKey) -> bool:
    """Whether a request in `namespace` may read the series: one a PredictiveAutoscaler owns only from
    the autoscaler's namespace (Kubernetes namespaces have no dots, so the owner's is before the first)."""
    owner = key.label(AUTOSCALER_LABEL)
    return owner is None or (bool(namespace) and owner.partition(".")[0] == namespace)


class NamespacedSeries:
    """A series repository seen from one namespace: the series it may not read are not there."""

    def __init__(self, inner: SeriesRepository, namespace: str) -> None:
        self.inner = inner
        self.namespace = namespace

    async def find(self, key: SeriesKey) -> Series | None:
        found = await self.inner.find(key)
        return found if found is not None and visible_from(self.namespace, found.key) else None

    async def get_or_add(
        self, key: SeriesKey, step_s: float, aggregation: Aggregation, gpu_shape: str | None
    ) -> Series:
        raise PermissionError("a namespaced view of the series is read-only")

    async def all(self) -> list[Series]:
        return [s for s in await self.inner.all() if visible_from(self.namespace, s.key)]

    async def matching(self, metric: str, selector: dict[str, str]) -> list[Series]:
        found = await self.inner.matching(metric, selector)
        return [s for s in found if visible_from(self.namespace, s.key)]


async def namespaced_metric_value(
    uow: ForecasterUnitOfWork, namespace: str, ref: MetricRef, *, now: datetime
) -> MetricValue:
    """`metric_value` over the series a request in `namespace` may read (the unit of work is the
    request's own: its series repository is replaced by the namespace's view of it)."""
    uow.series = NamespacedSeries(uow.series, namespace)
    return await metric_value(uow, ref.series_metric, ref.selector, now=now, window_s=ref.window_s)


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
    """The served value of `metric` (a series' metric name) over the series of the namespace's the
    selector matches. The selector's `window` label, when present, is the prediction window in seconds.
    No series matching is an empty list, as Kubernetes answers a selector that matches nothing, whether
    there is none or it is another namespace's."""
    deps = _deps(request)
    try:
        selector = parse_selector(label_selector)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from exc
    ref = MetricRef.from_selector(metric, selector, deps.default_window_s)
    now = deps.clock()
    async with deps.uow() as uow:
        value = await namespaced_metric_value(uow, namespace, ref, now=now)
    if not value.found:
        return {"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": []}
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


@router.get("/v1/series", tags=["forecasts"], responses=AUTH_RESPONSES)
async def list_series(
    request: Request,
    namespace: str | None = Query(None, description="only what a request in this namespace may read"),
) -> list[dict[str, Any]]:
    """Each series' chosen model, backtest scores and served value. A tenant's token sees the series of
    its own namespace (and the cluster's, which no namespace owns), as the external metrics API does."""
    deps = _deps(request)
    scope = await deps.tokens.scope(request, namespace)
    now = deps.clock()
    out = []
    async with deps.uow() as uow:
        if scope.tenant is not None or scope.nothing:
            # no known tenant: as from no namespace, the cluster's series alone
            uow.series = NamespacedSeries(uow.series, scope.tenant or "")
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
