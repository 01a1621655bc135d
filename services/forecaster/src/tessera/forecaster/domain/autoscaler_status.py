"""What a PredictiveAutoscaler's status says: the chosen model and its recent error, the served forecast,
the recommended replicas and why, and three conditions (Ready, Forecasting, Scaling) whose transition
times move only when their status does. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tessera.forecaster.domain.autoscaler import AutoscalerSpec
from tessera.forecaster.domain.forecast import replicas


@dataclass(frozen=True)
class Observed:
    """What the controller found for one autoscaler this round."""

    value: float | None = None
    """the served value (window maximum plus margin, or the reactive reading); None: no series"""
    expected: float | None = None
    source: str | None = None
    reason: str | None = None
    model: str | None = None
    recent_error: float | None = None
    problem: tuple[str, str] | None = None
    """(reason, message) that keeps it from being Ready: an unknown target or metric, a PromQL error"""
    kept: bool = False
    """the HPA or ScaledObject it owns is kept through the problem (a failed query) and acts on what is
    still served: the last good forecast while it reaches now, then the last reading"""


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str

    def as_dict(self, at: str) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": "True" if self.status else "False",
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": at,
        }


def conditions(pa: AutoscalerSpec, observed: Observed) -> list[Condition]:
    if observed.problem is not None:
        ready = Condition("Ready", False, *observed.problem)
    else:
        ready = Condition("Ready", True, "Ready", "the target and the metric are known")
    if observed.value is None:
        forecasting = Condition("Forecasting", False, "NoSeries", "no series of the metric yet")
    elif observed.source == "forecast":
        forecasting = Condition("Forecasting", True, "Forecast", f"served by model {observed.model}")
    else:
        why = observed.reason or "no forecast"
        forecasting = Condition("Forecasting", False, "Reactive", f"serving the last reading: {why}")
    owned = "HorizontalPodAutoscaler" if pa.via == "hpa" else "ScaledObject"
    if observed.problem is not None and observed.kept:
        scaling = Condition(
            "Scaling",
            True,
            "Kept",
            f"{owned} {pa.namespace}/{pa.name} is kept through {observed.problem[0]} and acts on the last"
            " good forecast or the last reading",
        )
    elif observed.problem is not None:
        scaling = Condition("Scaling", False, observed.problem[0], observed.problem[1])
    elif pa.mode == "Preview":
        scaling = Condition("Scaling", False, "Preview", "Preview mode only recommends replicas")
    else:
        scaling = Condition(
            "Scaling", True, "Owned", f"{owned} {pa.namespace}/{pa.name} acts on the forecast"
        )
    return [ready, forecasting, scaling]


def status(
    pa: AutoscalerSpec,
    observed: Observed,
    *,
    now: datetime,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The status to write. A condition keeps its lastTransitionTime while its status is unchanged."""
    stamp = now.isoformat().replace("+00:00", "Z")
    before = {str(c.get("type")): c for c in previous if isinstance(c, Mapping)}
    out_conditions = []
    for c in conditions(pa, observed):
        old = before.get(c.type)
        same = old is not None and old.get("status") == ("True" if c.status else "False")
        at = str(old.get("lastTransitionTime")) if same and old is not None else stamp
        out_conditions.append(c.as_dict(at))
    out: dict[str, Any] = {"observedGeneration": pa.generation, "conditions": out_conditions}
    if observed.value is not None:
        recommended = replicas(observed.value, pa.target, pa.min_replicas, pa.max_replicas)
        out.update(
            forecast=round(observed.value, 6),
            expected=round(observed.expected if observed.expected is not None else observed.value, 6),
            source=observed.source,
            recommendedReplicas=recommended,
            reason=_reason(pa, observed, recommended),
        )
    elif observed.problem is not None:
        out["reason"] = observed.problem[1]
    if observed.model is not None:
        out["model"] = observed.model
    if observed.recent_error is not None:
        out["recentError"] = round(observed.recent_error, 6)
    return out


def _reason(pa: AutoscalerSpec, observed: Observed, recommended: int) -> str:
    value = observed.value or 0.0
    basis = (
        f"forecast max over {pa.window_s}s ({observed.model})"
        if observed.source == "forecast"
        else f"last reading ({observed.reason or 'no forecast'})"
    )
    return f"{basis} {value:.3g} / target {pa.target:g} per replica -> {recommended}"
