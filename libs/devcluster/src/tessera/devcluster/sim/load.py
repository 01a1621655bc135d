"""A load generator: replays a request-rate series into a Deployment's pods, one step at a time.

Each step the load is the series' next value; the Deployment's ready pods (Ready condition, counted
through the API server with the official client) share it, so each one's utilisation is
`load / ready / capacity`. A step is under-provisioned when fewer pods are ready than
`ceil(load / capacity)`. Pods take the devcluster's `pod_start_seconds` to become ready, so a scale-up
decided late shows up as short steps.

The current load is served as an External metric (`ExternalMetricValueList` on
`/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}`), what a reactive HPA reads, and handed
to `on_load` each step (to record it for the forecaster, say)."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp.web

METRICS_PREFIX = "/apis/external.metrics.k8s.io/v1beta1/namespaces/"


@dataclass(frozen=True)
class LoadStep:
    index: int
    at: datetime
    load: float
    ready: int
    needed: int

    @property
    def under(self) -> bool:
        return self.ready < self.needed

    def utilisation(self, capacity: float) -> float:
        return math.inf if self.ready == 0 and self.load > 0 else self.load / max(self.ready, 1) / capacity


@dataclass
class LoadGenerator:
    """`rates[i]` is the load of step i; `capacity` the load one ready pod carries; `step_s` wall
    seconds per step."""

    api_url: str
    namespace: str
    deployment: str
    rates: Sequence[float]
    capacity: float
    step_s: float = 1.0
    metric: str = "load"
    on_load: Callable[[float, datetime], Awaitable[None]] | None = None
    steps: list[LoadStep] = field(default_factory=list)
    current: float = 0.0
    _runner: aiohttp.web.AppRunner | None = None
    port: int | None = None

    def __post_init__(self) -> None:
        if self.capacity <= 0:
            raise ValueError(f"capacity: must be positive, got {self.capacity}")
        if self.step_s <= 0:
            raise ValueError(f"step_s: must be positive, got {self.step_s}")
        if any(r < 0 or not math.isfinite(r) for r in self.rates):
            raise ValueError("rates: must be finite and not negative")
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.api_url
        self._api = client.ApiClient(configuration)
        self._apps = client.AppsV1Api(self._api)
        self._core = client.CoreV1Api(self._api)

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("the load generator's metrics endpoint is not serving")
        return f"http://127.0.0.1:{self.port}"

    def ready_pods(self) -> int:
        """Ready pods matching the Deployment's selector."""
        deployment: Any = self._apps.read_namespaced_deployment(self.deployment, self.namespace)
        labels = deployment.spec.selector.match_labels or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        pods: Any = self._core.list_namespaced_pod(self.namespace, label_selector=selector)
        return sum(
            1
            for pod in pods.items
            if pod.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
        )

    async def _metric(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        if request.match_info["metric"] != self.metric:
            return aiohttp.web.json_response({"kind": "Status", "status": "Failure", "code": 404}, status=404)
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        value = f"{round(self.current * 1000)}m"
        item = {"metricName": self.metric, "metricLabels": {}, "timestamp": now, "value": value}
        body = {
            "kind": "ExternalMetricValueList",
            "apiVersion": "external.metrics.k8s.io/v1beta1",
            "metadata": {},
            "items": [item],
        }
        return aiohttp.web.json_response(body)

    async def serve(self) -> str:
        app = aiohttp.web.Application()
        app.router.add_get(METRICS_PREFIX + "{namespace}/{metric}", self._metric)
        self._runner = aiohttp.web.AppRunner(app)
        await self._runner.setup()
        site = aiohttp.web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._api.close()  # type: ignore[no-untyped-call]

    async def step(self, index: int) -> LoadStep:
        """Apply step `index`'s load and measure it against the pods ready now."""
        self.current = float(self.rates[index])
        at = datetime.now(UTC)
        if self.on_load is not None:
            await self.on_load(self.current, at)
        ready = await asyncio.to_thread(self.ready_pods)
        needed = max(1, math.ceil(self.current / self.capacity - 1e-9))
        taken = LoadStep(index, at, self.current, ready, needed)
        self.steps.append(taken)
        return taken

    async def run(self, stop: asyncio.Event | None = None) -> list[LoadStep]:
        """Every step of the series, `step_s` apart (or until `stop`)."""
        stop = stop or asyncio.Event()
        for i in range(len(self.rates)):
            if stop.is_set():
                break
            await self.step(i)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.step_s)
        return self.steps

    def under_provisioned(self, since: int = 0) -> int:
        return sum(1 for s in self.steps if s.index >= since and s.under)
