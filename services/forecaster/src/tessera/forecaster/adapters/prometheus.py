"""A Prometheus metric source: an instant PromQL query over Prometheus' HTTP API (`GET /api/v1/query`).

The answer's value is the sum over the returned vector (or the scalar); an empty vector is no reading.
A query Prometheus rejects raises `PromQLError` with Prometheus' own `errorType` and `error`, so the
PredictiveAutoscaler's status can show them. Synchronous (stdlib HTTP): the controller calls it from a
worker thread."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from typing import Any


class PromQLError(RuntimeError):
    """Prometheus answered with an error (or could not be reached); the message is Prometheus' own."""


class PrometheusSource:
    def __init__(self, base_url: str, *, timeout_s: float = 5.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"prometheus url must be http(s), not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def query(self, promql: str, at: datetime) -> float | None:
        params = urllib.parse.urlencode({"query": promql, "time": f"{at.timestamp():.3f}"})
        url = f"{self.base_url}/api/v1/query?{params}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400 bad_data, 422 execution, 503 timeout: the body says why
            body = _error_body(exc)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise PromQLError(f"prometheus at {self.base_url} unreachable: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise PromQLError(f"prometheus answered with no JSON: {exc}") from exc
        return parse_response(body)


def _error_body(exc: urllib.error.HTTPError) -> Any:
    try:
        return json.loads(exc.read())
    except (json.JSONDecodeError, OSError):
        return {"status": "error", "errorType": f"http {exc.code}", "error": str(exc.reason)}


def parse_response(body: Any) -> float | None:
    """The value of an instant query's answer, as the HTTP API documents it."""
    if not isinstance(body, dict):
        raise PromQLError("prometheus answered with something other than an object")
    if body.get("status") != "success":
        raise PromQLError(f"{body.get('errorType', 'error')}: {body.get('error', 'no message')}")
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        return _sample(result)
    if kind == "vector":
        values = [_sample(item.get("value")) for item in result or []]
        return sum(values) if values else None
    raise PromQLError(f"the query must give a vector or a scalar, not a {kind}")


def _sample(pair: Any) -> float:
    try:
        value = float(pair[1])
    except (TypeError, IndexError, ValueError) as exc:
        raise PromQLError(f"a sample that is not [time, value]: {pair!r}") from exc
    if not math.isfinite(value):
        raise PromQLError(f"the query gave {value}")
    return value
