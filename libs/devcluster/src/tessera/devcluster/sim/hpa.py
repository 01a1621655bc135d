"""The HorizontalPodAutoscaler (`autoscaling/v2`) as the devcluster serves and simulates it.

`HORIZONTAL_POD_AUTOSCALERS` is the resource type; an API server built with it in its registry stores
and serves HPAs. The algorithm follows upstream's horizontal pod autoscaler controller
(`pkg/controller/podautoscaler`: `replica_calculator.go` and `horizontal.go`):

- an External metric with an `AverageValue` target: `desired = ceil(total / averageValue)`, kept at the
  current count while `|total / (averageValue * current) - 1| <= tolerance` (0.1 by default);
  a `Value` target: `desired = ceil(current * value / target)` under the same tolerance;
- several metrics: the largest proposal;
- behaviour: the recommendation is stabilised over the window of its direction (scale-down keeps the
  largest recommendation of the last `stabilizationWindowSeconds`, 300 by default; scale-up the
  smallest, 0 s by default), then clamped to [minReplicas, maxReplicas].

External metrics are read over HTTP from the metrics API the controller is given: the devcluster's API
server itself, which proxies `external.metrics.k8s.io` to the registered APIService's backend as the
aggregation layer does (`apiserver.aggregation`), or a backend directly. The scale-rate policies (`behavior.*.policies`) are not simulated: upstream's defaults (scale-up by
100% or 4 pods per 15 s, scale-down by 100% per 15 s) do not bind at the sizes the devcluster runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.devcluster.apiserver.resources import ResourceType

log = logging.getLogger(__name__)
HORIZONTAL_POD_AUTOSCALERS = ResourceType(
    "autoscaling",
    "v2",
    "horizontalpodautoscalers",
    "HorizontalPodAutoscaler",
    True,
    ("hpa",),
    frozenset({"status"}),
    categories=("all",),
)
DEFAULT_TOLERANCE = 0.1
DEFAULT_SCALE_DOWN_WINDOW_S = 300.0
DEFAULT_SCALE_UP_WINDOW_S = 0.0


def external_average_value_replicas(
    current: int, total: float, average_value: float, tolerance: float = DEFAULT_TOLERANCE
) -> int:
    """Upstream's `GetExternalPerPodMetricReplicas`: the replicas that bring the total per replica to the
    target, or the current count while the ratio is within the tolerance."""
    if average_value <= 0:
        raise ValueError("averageValue must be positive")
    if current > 0 and abs(total / (average_value * current) - 1.0) <= tolerance:
        return current
    return math.ceil(total / average_value)


def external_value_replicas(
    current: int, value: float, target: float, tolerance: float = DEFAULT_TOLERANCE
) -> int:
    """Upstream's `GetExternalMetricReplicas` for a `Value` target: scale by usage / target."""
    if target <= 0:
        raise ValueError("target value must be positive")
    ratio = value / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    return math.ceil(ratio * current)


def parse_quantity(text: str | float | int) -> float:
    """A Kubernetes quantity as a float (`1500m`, `2`, `1k`, `1Ki`)."""
    if isinstance(text, int | float):
        return float(text)
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * suffixes[suffix]
    return float(text)


@dataclass(frozen=True)
class Behavior:
    scale_up_window_s: float = DEFAULT_SCALE_UP_WINDOW_S
    scale_down_window_s: float = DEFAULT_SCALE_DOWN_WINDOW_S

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Behavior:
        behavior = spec.get("behavior") or {}
        up = (behavior.get("scaleUp") or {}).get("stabilizationWindowSeconds")
        down = (behavior.get("scaleDown") or {}).get("stabilizationWindowSeconds")
        return cls(
            DEFAULT_SCALE_UP_WINDOW_S if up is None else float(up),
            DEFAULT_SCALE_DOWN_WINDOW_S if down is None else float(down),
        )


@dataclass
class Stabiliser:
    """Upstream's `stabilizeRecommendationWithBehaviors`: recommendations are kept with their time; a
    scale-up takes the smallest over the up window, a scale-down the largest over the down window."""

    recommendations: deque[tuple[float, int]] = field(default_factory=deque)

    def stabilise(self, now: float, recommendation: int, current: int, behavior: Behavior) -> int:
        self.recommendations.append((now, recommendation))
        longest = max(behavior.scale_up_window_s, behavior.scale_down_window_s)
        while self.recommendations and self.recommendations[0][0] < now - longest:
            self.recommendations.popleft()
        up_floor = recommendation
        down_ceiling = recommendation
        for at, value in self.recommendations:
            if at >= now - behavior.scale_up_window_s:
                up_floor = min(up_floor, value)
            if at >= now - behavior.scale_down_window_s:
                down_ceiling = max(down_ceiling, value)
        if recommendation > current:
            return max(current, up_floor)
        if recommendation < current:
            return min(current, down_ceiling)
        return current


def desired_replicas(
    spec: Mapping[str, Any],
    current: int,
    external: Mapping[str, float],
    stabiliser: Stabiliser,
    now: float,
    tolerance: float = DEFAULT_TOLERANCE,
) -> int:
    """One HPA sync: the External metrics' proposals (their values by metric name), the largest of them,
    stabilised, then clamped. A metric with no value proposes nothing; with none, the count stays."""
    proposals = []
    for metric in spec.get("metrics") or []:
        if metric.get("type") != "External":
            continue
        ext = metric.get("external") or {}
        name = str((ext.get("metric") or {}).get("name"))
        if name not in external:
            continue
        target = ext.get("target") or {}
        if target.get("type") == "AverageValue":
            proposals.append(
                external_average_value_replicas(
                    current, external[name], parse_quantity(target["averageValue"]), tolerance
                )
            )
        elif target.get("type") == "Value":
            proposals.append(
                external_value_replicas(current, external[name], parse_quantity(target["value"]), tolerance)
            )
    if not proposals:
        return current
    stabilised = stabiliser.stabilise(now, max(proposals), current, Behavior.of(spec))
    low = int(spec.get("minReplicas") or 1)
    high = int(spec.get("maxReplicas") or low)
    return max(low, min(high, stabilised))


class HpaController:
    """The HPA controller, as kube-controller-manager runs it, against an API server through the official
    client: every `sync_s` each HPA reads its target's `/scale`, asks the registered external metrics API
    for each External metric (`GET /apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}`
    with the metric's selector; the value is the sum of the items, as upstream sums them), computes the
    replicas as above and writes `/scale` and the HPA's status. Blocking calls: run `sync_once` in a
    worker thread, or `run()` as a task."""

    def __init__(
        self,
        api_url: str,
        metrics_url: str,
        *,
        sync_s: float = 15.0,
        tolerance: float = DEFAULT_TOLERANCE,
        clock: Callable[[], float] = time.monotonic,
        only: Collection[str] | None = None,
    ) -> None:
        """`only`: the HPAs (namespace/name) it acts on; all by default (one controller per metrics API)."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = api_url
        self._api = client.ApiClient(configuration)
        self._apps = client.AppsV1Api(self._api)
        self._autoscaling = client.AutoscalingV2Api(self._api)
        self.metrics_url = metrics_url.rstrip("/")
        self.sync_s = sync_s
        self.tolerance = tolerance
        self.clock = clock
        self.only = None if only is None else frozenset(only)
        self._stabilisers: dict[str, Stabiliser] = {}
        #: (time, namespace/name, from, to) of every scale it made
        self.scales: list[tuple[float, str, int, int]] = []

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def external_value(self, namespace: str, metric: Mapping[str, Any]) -> float | None:
        """The metric's value from the metrics API: the sum of its items; None when it has none."""
        selector = (metric.get("selector") or {}).get("matchLabels") or {}
        query = urllib.parse.urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())})
        name = urllib.parse.quote(str(metric["name"]), safe="")
        url = f"{self.metrics_url}/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{name}?{query}"
        try:
            with urllib.request.urlopen(url, timeout=5.0) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError:  # unknown metric: no proposal, as upstream's FailedGetExternalMetric
            return None
        items = body.get("items") or []
        return sum(parse_quantity(item["value"]) for item in items) if items else None

    def sync_once(self) -> dict[str, int]:
        """One pass over every HPA; returns the desired replicas of each (namespace/name)."""
        response: Any = self._autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces(
            _preload_content=False
        )
        out = {}
        for hpa in json.loads(response.data).get("items") or []:
            meta, spec = hpa["metadata"], hpa["spec"]
            key = f"{meta['namespace']}/{meta['name']}"
            ref = spec["scaleTargetRef"]
            if ref.get("kind") != "Deployment" or (self.only is not None and key not in self.only):
                continue  # the devcluster scales Deployments
            scale: Any = self._apps.read_namespaced_deployment_scale(ref["name"], meta["namespace"])
            current = int(scale.spec.replicas or 0)
            values = {}
            for metric in spec.get("metrics") or []:
                if metric.get("type") == "External":
                    ext = metric["external"]["metric"]
                    value = self.external_value(meta["namespace"], ext)
                    if value is not None:
                        values[ext["name"]] = value
            stabiliser = self._stabilisers.setdefault(key, Stabiliser())
            now = self.clock()
            desired = desired_replicas(spec, current, values, stabiliser, now, self.tolerance)
            if desired != current:
                self._apps.patch_namespaced_deployment_scale(
                    ref["name"], meta["namespace"], {"spec": {"replicas": desired}}, _preload_content=False
                )
                self.scales.append((now, key, current, desired))
            self._autoscaling.patch_namespaced_horizontal_pod_autoscaler_status(
                meta["name"],
                meta["namespace"],
                {"status": {"currentReplicas": current, "desiredReplicas": desired}},
                _preload_content=False,
            )
            out[key] = desired
        return out

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.to_thread(self.sync_once)
            except Exception as exc:  # a target gone or the server restarting: the next sync tries again
                log.warning("hpa sync failed: %r", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.sync_s)
