"""How an autoscaler names what it wants: a metric and a selector of series labels, with the prediction
window as the `window` entry (seconds; 0 asks for the last reading, unforecast, as a plain HPA on the
metric would read it). The same for the external metrics API and KEDA's scaler metadata."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

WINDOW = "window"
#: the metric names a PredictiveAutoscaler's `gpuUtilization` metric maps to
GPU_UTILIZATION = "gpuUtilization"


def parse_selector(text: str) -> dict[str, str]:
    """`a=b,c=d` (equality only; `==` too) into a dict."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("==") if "==" in part else part.partition("=")
        if not sep or not key.strip() or "!" in key:
            raise ValueError(f"unsupported selector term {part!r}: only key=value")
        out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class MetricRef:
    series_metric: str
    selector: dict[str, str] = field(default_factory=dict)
    window_s: float = 300.0

    @classmethod
    def from_selector(cls, metric: str, selector: Mapping[str, str], default_window_s: float) -> MetricRef:
        labels = dict(selector)
        raw = labels.pop(WINDOW, None)
        try:
            window_s = float(raw) if raw is not None else default_window_s
        except ValueError:
            window_s = default_window_s
        series_metric = "gpu_busy" if metric == GPU_UTILIZATION else metric
        if not math.isfinite(window_s):
            window_s = default_window_s
        return cls(series_metric, labels, max(window_s, 0.0))
