"""The controller's passes over in-memory repositories and a fake cluster: what it owns is created only on
a pass without a problem, kept (and still brought up to the spec) through a problem of its metric, such as
one failed Prometheus query, kept for a grace period while its target is missing, and deleted in Preview,
for a target kind it cannot read or a target gone past the grace."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tessera.forecaster.adapters.kube_autoscalers import NotOwned, covers
from tessera.forecaster.domain.autoscaler import AutoscalerSpec, TargetRef
from tessera.forecaster.domain.model import Series
from tessera.forecaster.domain.series import SeriesKey
from tessera.forecaster.service_layer.autoscaling import HPA, SCALED_OBJECT, AutoscalerController
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.engine import EngineConfig
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork
from tessera.testing.fakes import FakeUnitOfWork

NOW = datetime(2026, 11, 24, 3, 0, tzinfo=UTC)
Key = tuple[tuple[str, str, str], str, str]


class Store:
    def __init__(self) -> None:
        self.series: list[Series] = []
        self.readings: list[tuple[int, datetime, float]] = []


class Repos:
    """series, forecasts (none stored: the served value is the last reading, 0 with none), models and
    observations over one Store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def matching(self, metric: str, selector: dict[str, str]) -> list[Series]:
        return [s for s in self.store.series if s.key.matches(metric, selector)]

    async def get_or_add(self, key: SeriesKey, step_s: float, aggregation: str, shape: str | None) -> Series:
        for s in self.store.series:
            if s.key == key:
                return s
        self.store.series.append(Series(len(self.store.series) + 1, key, step_s))
        return self.store.series[-1]

    async def add(self, series_id: int, at: datetime, label: str, value: float) -> None:
        self.store.readings.append((series_id, at, value))

    async def get(self, series_id: int) -> Any:
        return None


class Uow(FakeUnitOfWork, ForecasterUnitOfWork):
    store = Store()

    def open_repositories(self, session: object) -> None:
        repos = Repos(self.store)
        self.series = self.forecasts = self.models = self.observations = repos  # type: ignore[assignment]


class Cluster:
    """Objects by (group/version/plural, namespace, name); targets that exist; what was written."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.targets: set[str] = {"chat"}
        self.keda = True
        self.writes: list[tuple[str, str, str]] = []
        self.statuses: dict[str, dict[str, Any]] = {}
        self.events: list[str] = []

    def list(self) -> list[dict[str, Any]]:
        raise AssertionError("not listed in these tests")

    def target_exists(self, namespace: str, ref: TargetRef) -> bool:
        if ref.kind == "CronJob":
            raise ValueError("scaleTargetRef must be an apps/v1 Deployment, StatefulSet, ReplicaSet")
        return ref.name in self.targets

    def serves(self, group: str, version: str, plural: str) -> bool:
        return self.keda or group != "keda.sh"

    def apply(
        self, gvp: tuple[str, str, str], desired: dict[str, Any], owner_uid: str, *, create: bool = True
    ) -> str:
        meta = desired["metadata"]
        key = (gvp, meta["namespace"], meta["name"])
        existing = self.objects.get(key)
        if existing is None:
            if not create:
                return "absent"
            self.objects[key] = copy.deepcopy(desired)
            self.writes.append(("create", gvp[2], meta["name"]))
            return "created"
        if existing["metadata"]["ownerReferences"][0]["uid"] != owner_uid:
            raise NotOwned("not ours")
        if covers(existing["spec"], desired["spec"]):
            return "unchanged"
        self.objects[key] = copy.deepcopy(desired)
        self.writes.append(("update", gvp[2], meta["name"]))
        return "updated"

    def remove(self, gvp: tuple[str, str, str], namespace: str, name: str, owner_uid: str) -> bool:
        if self.objects.pop((gvp, namespace, name), None) is None:
            return False
        self.writes.append(("delete", gvp[2], name))
        return True

    def write_status(self, pa: AutoscalerSpec, status: dict[str, Any]) -> None:
        self.statuses[pa.name] = status

    def event(self, pa: AutoscalerSpec, kind: str, reason: str, message: str, now: datetime) -> None:
        self.events.append(reason)

    def owned(self, name: str, gvp: tuple[str, str, str] = HPA) -> dict[str, Any] | None:
        return self.objects.get((gvp, "default", name))


class Prometheus:
    def __init__(self) -> None:
        self.fails: Exception | None = None

    def query(self, promql: str, at: datetime) -> float | None:
        if self.fails is not None:
            raise self.fails
        return 42.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


@pytest.fixture
def prometheus() -> Prometheus:
    return Prometheus()


@pytest.fixture
def controller(cluster: Cluster, prometheus: Prometheus, clock: Clock) -> AutoscalerController:
    store = Store()
    store.series = [Series(1, SeriesKey.of("requests_per_s", {"app": "chat"}), 60.0)]
    Uow.store = store
    deps = ForecasterDeps(
        uow=Uow,
        stop=asyncio.Event(),
        step_s=60.0,
        engine=EngineConfig(),
        candidates=list,
        history_s=3600.0,
        default_window_s=120.0,
        clock=clock,
    )
    return AutoscalerController(deps, cluster, lambda: "forecaster:9090", prometheus, target_grace_s=300.0)


def pa(name: str = "chat", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
            "maxReplicas": 20,
            "metric": {"type": "prometheus", "prometheus": {"query": "sum(chat_requests)"}},
            "target": 10,
            **spec,
        },
    }


def conditions(cluster: Cluster, name: str = "chat") -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in cluster.statuses[name]["conditions"]}


async def test_a_failed_query_after_the_metric_worked_keeps_the_hpa_on_the_fallback(
    controller: AutoscalerController, cluster: Cluster, prometheus: Prometheus
) -> None:
    await controller.reconcile(pa())
    assert cluster.writes == [("create", "horizontalpodautoscalers", "chat")]

    prometheus.fails = TimeoutError("timed out")  # one pass with Prometheus away
    await controller.reconcile(pa())
    assert cluster.owned("chat") is not None
    assert cluster.writes == [("create", "horizontalpodautoscalers", "chat")]  # not deleted, not recreated
    assert conditions(cluster) == {
        "Ready": ("False", "PrometheusError"),
        "Forecasting": ("False", "Reactive"),
        "Scaling": ("True", "Kept"),
    }
    status = cluster.statuses["chat"]
    assert status["source"] == "reactive" and "recommendedReplicas" in status  # what the HPA is served
    assert cluster.events == ["PrometheusError"]

    prometheus.fails = None
    await controller.reconcile(pa())
    assert conditions(cluster)["Ready"] == ("True", "Ready")
    assert conditions(cluster)["Scaling"] == ("True", "Owned")
    assert cluster.writes == [("create", "horizontalpodautoscalers", "chat")]


async def test_a_metric_that_never_worked_gets_no_hpa(
    controller: AutoscalerController, cluster: Cluster, prometheus: Prometheus
) -> None:
    prometheus.fails = RuntimeError("bad_data: parse error")
    for _ in range(2):
        await controller.reconcile(pa())
    assert cluster.writes == []
    assert conditions(cluster)["Ready"] == ("False", "PrometheusError")
    assert conditions(cluster)["Scaling"] == ("False", "PrometheusError")

    ghost = {"type": "events", "events": {"name": "nobody_records_this"}}
    await controller.reconcile(pa("ghost", metric=ghost))
    assert cluster.owned("ghost") is None
    assert conditions(cluster, "ghost")["Ready"] == ("False", "MetricNotFound")


async def test_a_kept_object_still_follows_the_spec(
    controller: AutoscalerController, cluster: Cluster, prometheus: Prometheus
) -> None:
    await controller.reconcile(pa())
    prometheus.fails = TimeoutError("timed out")
    await controller.reconcile(pa(maxReplicas=8))
    hpa = cluster.owned("chat")
    assert hpa is not None and hpa["spec"]["maxReplicas"] == 8
    assert cluster.writes[-1] == ("update", "horizontalpodautoscalers", "chat")


async def test_a_scaled_object_to_zero_is_kept_through_a_failed_query(
    controller: AutoscalerController, cluster: Cluster, prometheus: Prometheus
) -> None:
    await controller.reconcile(pa(via="keda", minReplicas=0))
    assert cluster.owned("chat", SCALED_OBJECT) is not None
    prometheus.fails = ConnectionError("503 Service Unavailable")
    await controller.reconcile(pa(via="keda", minReplicas=0))
    assert cluster.owned("chat", SCALED_OBJECT) is not None
    assert [w[0] for w in cluster.writes] == ["create"]
    assert conditions(cluster)["Scaling"] == ("True", "Kept")


async def test_a_missing_target_keeps_the_hpa_for_the_grace_period_then_deletes_it(
    controller: AutoscalerController, cluster: Cluster, clock: Clock
) -> None:
    await controller.reconcile(pa())
    cluster.targets.clear()  # the Deployment is deleted
    await controller.reconcile(pa())
    assert cluster.owned("chat") is not None
    assert conditions(cluster)["Ready"] == ("False", "TargetNotFound")
    assert conditions(cluster)["Scaling"] == ("False", "TargetNotFound")  # kept, but it scales nothing

    clock.now += timedelta(seconds=299)
    await controller.reconcile(pa())
    assert cluster.owned("chat") is not None
    cluster.targets.add("chat")  # created again within the grace: the same HPA, its history intact
    clock.now += timedelta(seconds=60)
    await controller.reconcile(pa())
    assert conditions(cluster)["Ready"] == ("True", "Ready")
    assert [w[0] for w in cluster.writes] == ["create"]

    cluster.targets.clear()  # gone again: the grace starts over, then it is deleted
    clock.now += timedelta(seconds=60)
    await controller.reconcile(pa())
    assert cluster.owned("chat") is not None
    clock.now += timedelta(seconds=300)
    await controller.reconcile(pa())
    assert cluster.owned("chat") is None
    assert [w[0] for w in cluster.writes] == ["create", "delete"]


async def test_preview_and_a_target_it_cannot_read_delete_what_it_owns(
    controller: AutoscalerController, cluster: Cluster
) -> None:
    await controller.reconcile(pa())
    await controller.reconcile(pa(mode="Preview"))
    assert cluster.owned("chat") is None
    await controller.reconcile(pa())
    assert cluster.owned("chat") is not None
    cron = {"apiVersion": "apps/v1", "kind": "CronJob", "name": "chat"}
    await controller.reconcile(pa(scaleTargetRef=cron))
    assert cluster.owned("chat") is None
    assert conditions(cluster)["Ready"] == ("False", "UnsupportedTarget")
