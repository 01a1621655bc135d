"""What autoscalers are served: a metric's value over the series it names, read from precomputed
forecasts (nothing is fit here). A restarted forecaster serves the last good forecast it stored while it
still reaches now, and otherwise the last reading, saying which."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tessera.forecaster.domain.forecast import Served, serve
from tessera.forecaster.service_layer.unit_of_work import ForecasterUnitOfWork


@dataclass(frozen=True)
class MetricValue:
    """A metric's served value: the sum over its series; `source` is reactive when any series is."""

    metric: str
    value: float
    expected: float
    source: str
    reason: str | None
    series: tuple[tuple[str, Served], ...]
    models: tuple[str, ...]

    @property
    def found(self) -> bool:
        return bool(self.series)


async def metric_value(
    uow: ForecasterUnitOfWork, metric: str, selector: dict[str, str], *, now: datetime, window_s: float
) -> MetricValue:
    served: list[tuple[str, Served]] = []
    for s in await uow.series.matching(metric, selector):
        latest = await uow.forecasts.get(s.id)
        if latest is None:
            served.append((str(s.key), serve(None, now=now, window_s=window_s, last_value=None)))
            continue
        served.append(
            (
                str(s.key),
                serve(
                    latest.forecast,
                    now=now,
                    window_s=window_s,
                    last_value=latest.last_value,
                    degraded=latest.degraded,
                ),
            )
        )
    reactive = [(k, v) for k, v in served if v.source == "reactive"]
    reason = "; ".join(f"{k}: {v.reason}" for k, v in reactive) or None
    return MetricValue(
        metric=metric,
        value=sum(v.value for _, v in served),
        expected=sum(v.expected for _, v in served),
        source="reactive" if reactive or not served else "forecast",
        reason=reason if served else "no_series",
        series=tuple(served),
        models=tuple(sorted({v.model for _, v in served if v.model})),
    )
