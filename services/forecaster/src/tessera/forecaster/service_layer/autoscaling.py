"""The PredictiveAutoscaler controller's decisions, one autoscaler at a time, level-triggered: read its
spec, check its target and metric, record a `prometheus` metric's reading, own the HPA or ScaledObject
(none in Preview) and write its status. A bad spec, an unknown target or metric, or a PromQL error
becomes a condition and an Event, never a crash. The cluster calls block (the official client), so they
run in a worker thread.

What it owns is created only on a pass without a problem, so an autoscaler whose metric never worked
gets none. A metric's problem (a failed Prometheus query, a series nobody records) keeps what it owns,
brought up to the spec: it acts on what is still served, the last good forecast and then the last
reading. A missing target keeps it for `target_grace_s` (a target deleted and created again keeps its
HPA's history). Preview, an invalid spec or a target kind it cannot read deletes it; deleting the
autoscaler deletes it through its owner reference."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

from tessera.forecaster.domain import autoscaler as pa_domain
from tessera.forecaster.domain.autoscaler import AutoscalerSpec, InvalidSpec, TargetRef
from tessera.forecaster.domain.autoscaler_status import Observed, status
from tessera.forecaster.domain.series import SeriesKey, bucket
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.forecaster.service_layer.metric_names import MetricRef
from tessera.forecaster.service_layer.queries import metric_value

log = logging.getLogger(__name__)
T = TypeVar("T")
HPA = ("autoscaling", "v2", "horizontalpodautoscalers")
SCALED_OBJECT = ("keda.sh", "v1alpha1", "scaledobjects")
#: problems of the metric: what it owns is kept (the served value falls back), never created
METRIC_PROBLEMS = frozenset({"PrometheusError", "PrometheusNotConfigured", "MetricNotFound"})
TARGET_NOT_FOUND = "TargetNotFound"


class AutoscalerCluster(Protocol):
    def list(self) -> list[dict[str, Any]]: ...
    def target_exists(self, namespace: str, ref: TargetRef) -> bool:
        """Whether the scale target exists; ValueError for a kind it cannot read."""
        ...

    def serves(self, group: str, version: str, plural: str) -> bool: ...
    def apply(
        self, gvp: tuple[str, str, str], desired: dict[str, Any], owner_uid: str, *, create: bool = True
    ) -> str:
        """Create it (unless not `create`: `absent`) or bring its spec to `desired`; NotOwned if another's."""
        ...

    def remove(self, gvp: tuple[str, str, str], namespace: str, name: str, owner_uid: str) -> bool: ...
    def write_status(self, pa: AutoscalerSpec, status: dict[str, Any]) -> None: ...
    def event(self, pa: AutoscalerSpec, kind: str, reason: str, message: str, now: datetime) -> None: ...


class MetricSource(Protocol):
    def query(self, promql: str, at: datetime) -> float | None:
        """The metric's value now; None when the query matches nothing. Raises with the source's message."""
        ...


@dataclass
class AutoscalerController:
    deps: ForecasterDeps
    cluster: AutoscalerCluster
    scaler_address: Callable[[], str]
    """where KEDA reaches the forecaster's external scaler (host:port)"""
    prometheus: MetricSource | None = None
    target_grace_s: float = 300.0
    """how long a missing scale target keeps what the autoscaler owns"""
    #: the last problem reported per autoscaler, so an Event is sent when it changes, not every round
    reported: dict[str, str | None] = field(default_factory=dict)
    #: when this replica first found an autoscaler's target missing, by the autoscaler's uid
    target_missing_since: dict[str, datetime] = field(default_factory=dict)

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    async def reconcile_all(self) -> int:
        """One pass over every PredictiveAutoscaler; returns how many it reconciled."""
        objects = await self._call(self.cluster.list)
        uids = {str((obj.get("metadata") or {}).get("uid")) for obj in objects}
        for uid in set(self.target_missing_since) - uids:
            del self.target_missing_since[uid]
        done = 0
        for obj in objects:
            try:
                await self.reconcile(obj)
                done += 1
            except Exception as exc:  # one autoscaler's failure (a conflict, a restart) never ends the pass
                meta = obj.get("metadata") or {}
                log.warning(
                    "reconcile failed",
                    extra={"autoscaler": f"{meta.get('namespace')}/{meta.get('name')}", "error": repr(exc)},
                )
        return done

    async def reconcile(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        now = self.deps.clock()
        try:
            pa = pa_domain.parse(obj)
        except InvalidSpec as exc:
            await self._invalid(obj, exc, now)
            return None
        observed = await self._observe(pa, now)
        if pa.mode != "Auto":
            await self._disown(pa)
        elif observed.problem is None:
            observed = await self._own(pa, observed)
        elif self._keeps(pa, observed.problem[0], now):
            observed = await self._keep(pa, observed)
        else:
            await self._disown(pa)
        previous = (obj.get("status") or {}).get("conditions") or []
        new_status = status(pa, observed, now=now, previous=previous)
        await self._call(self.cluster.write_status, pa, new_status)
        await self._report(pa, observed, now)
        return new_status

    def _keeps(self, pa: AutoscalerSpec, reason: str, now: datetime) -> bool:
        """Whether a problem keeps what the autoscaler owns: one of its metric's, or a target missing for
        less than the grace period."""
        if reason in METRIC_PROBLEMS:
            return True
        if reason == TARGET_NOT_FOUND:
            since = self.target_missing_since.get(pa.uid, now)
            return (now - since).total_seconds() < self.target_grace_s
        return False

    async def _observe(self, pa: AutoscalerSpec, now: datetime) -> Observed:
        try:
            exists = await self._call(self.cluster.target_exists, pa.namespace, pa.target_ref)
        except ValueError as exc:  # a kind it cannot read
            return Observed(problem=("UnsupportedTarget", str(exc)))
        if not exists:
            self.target_missing_since.setdefault(pa.uid, now)
            target = pa.target_ref
            message = f"{target.kind} {pa.namespace}/{target.name} does not exist"
            return Observed(problem=(TARGET_NOT_FOUND, message))
        self.target_missing_since.pop(pa.uid, None)
        problem = None
        if pa.metric.type == "prometheus":
            problem = await self._record_prometheus(pa, now)
        ref = MetricRef.from_selector(pa.series_metric(), pa.series_selector(), self.deps.default_window_s)
        async with self.deps.uow() as uow:
            value = await metric_value(uow, ref.series_metric, ref.selector, now=now, window_s=pa.window_s)
            recent_error = None
            if value.found:
                first = (await uow.series.matching(ref.series_metric, ref.selector))[0]
                chosen = await uow.models.get(first.id)
                if chosen is not None and chosen.chosen is not None:
                    mae = chosen.scores.get(chosen.chosen, {}).get("mae")
                    recent_error = float(mae) if isinstance(mae, int | float) else None
        if not value.found and pa.metric.type != "prometheus":
            return Observed(
                problem=(
                    "MetricNotFound",
                    f"no series of metric {ref.series_metric!r} matches {ref.selector}",
                )
            )
        if not value.found:
            return Observed(problem=problem)
        return Observed(
            value=value.value,
            expected=value.expected,
            source=value.source,
            reason=value.reason,
            model=",".join(value.models) or None,
            recent_error=recent_error,
            problem=problem,  # a failed query: what is still served, and why it is not Ready
        )

    async def _record_prometheus(self, pa: AutoscalerSpec, now: datetime) -> tuple[str, str] | None:
        """The query's value now becomes the newest observation of the autoscaler's own series."""
        if self.prometheus is None:
            return ("PrometheusNotConfigured", "the forecaster has no Prometheus URL (prometheus_url)")
        assert pa.metric.query is not None
        try:
            reading = await self._call(self.prometheus.query, pa.metric.query, now)
        except Exception as exc:
            return ("PrometheusError", str(exc)[:500])
        if reading is None:
            return None
        key = SeriesKey.of(pa.series_metric(), pa.series_selector())
        async with self.deps.uow() as uow:
            s = await uow.series.get_or_add(key, self.deps.step_s, "mean", None)
            await uow.observations.add(s.id, bucket(now, s.step_s), "", reading)
            await uow.commit()
        return None

    async def _own(self, pa: AutoscalerSpec, observed: Observed) -> Observed:
        if pa.via == "hpa":
            wanted, desired, other = HPA, pa_domain.hpa(pa), SCALED_OBJECT
        else:
            if not await self._call(self.cluster.serves, *SCALED_OBJECT):
                return _with_problem(
                    observed, "KedaNotInstalled", "the cluster serves no keda.sh ScaledObjects"
                )
            wanted, desired, other = SCALED_OBJECT, pa_domain.scaled_object(pa, self.scaler_address()), HPA
        try:
            await self._call(self.cluster.apply, wanted, desired, pa.uid)
        except Exception as exc:
            return _with_problem(observed, "OwnedObjectFailed", str(exc)[:500])
        if other != HPA or await self._call(self.cluster.serves, *other):
            await self._call(self.cluster.remove, other, pa.namespace, pa.name, pa.uid)
        return observed

    async def _keep(self, pa: AutoscalerSpec, observed: Observed) -> Observed:
        """A problem that keeps what it owns: an existing object is brought up to the spec (a changed
        bound or target still applies), none is created, the other kind is left as it is."""
        if pa.via == "hpa":
            wanted, desired = HPA, pa_domain.hpa(pa)
        elif await self._call(self.cluster.serves, *SCALED_OBJECT):
            wanted, desired = SCALED_OBJECT, pa_domain.scaled_object(pa, self.scaler_address())
        else:
            return observed
        try:
            done = await self._call(lambda: self.cluster.apply(wanted, desired, pa.uid, create=False))
        except Exception as exc:  # another's object, or the API server: the problem is still the one to say
            log.warning("keeping the owned object failed", extra={"autoscaler": pa.key, "error": repr(exc)})
            return observed
        # it acts on the forecast only while something is served (not for a target or a series gone)
        return replace(observed, kept=done != "absent" and observed.value is not None)

    async def _disown(self, pa: AutoscalerSpec) -> None:
        """Preview, an invalid spec, a target it cannot read or one gone past the grace: nothing of its
        own scales the target."""
        for gvp in (HPA, SCALED_OBJECT):
            if gvp == HPA or await self._call(self.cluster.serves, *gvp):
                await self._call(self.cluster.remove, gvp, pa.namespace, pa.name, pa.uid)

    async def _report(self, pa: AutoscalerSpec, observed: Observed, now: datetime) -> None:
        problem = observed.problem
        text = f"{problem[0]}: {problem[1]}" if problem else None
        if self.reported.get(pa.key, None) == text:
            return
        self.reported[pa.key] = text
        if problem is not None:
            await self._call(self.cluster.event, pa, "Warning", problem[0], problem[1], now)

    async def _invalid(self, obj: dict[str, Any], exc: InvalidSpec, now: datetime) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        stub = AutoscalerSpec(
            namespace=str(meta.get("namespace") or "default"),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            generation=int(meta.get("generation") or 0),
            target_ref=TargetRef("", "", ""),
            min_replicas=0,
            max_replicas=1,
            metric=pa_domain.MetricSpec("events", event_name="-"),
            target=1.0,
            window_s=1,
            mode="Preview",
            via="hpa",
        )
        await self._disown(stub)
        observed = Observed(problem=("InvalidSpec", str(exc)))
        previous = (obj.get("status") or {}).get("conditions") or []
        await self._call(self.cluster.write_status, stub, status(stub, observed, now=now, previous=previous))
        if self.reported.get(key) != str(exc):
            self.reported[key] = str(exc)
            await self._call(self.cluster.event, stub, "Warning", "InvalidSpec", str(exc), now)


def _with_problem(observed: Observed, reason: str, message: str) -> Observed:
    return replace(observed, problem=(reason, message))
