"""Prometheus' instant-query answers, as its HTTP API documents them, read into one value."""

from __future__ import annotations

import pytest

from tessera.forecaster.adapters.prometheus import PrometheusSource, PromQLError, parse_response


def vector(*values: str) -> dict[str, object]:
    result = [{"metric": {"pod": f"p{i}"}, "value": [1700000000.0, v]} for i, v in enumerate(values)]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_a_vector_is_summed_a_scalar_read_and_an_empty_vector_is_no_reading() -> None:
    assert parse_response(vector("1.5", "2")) == 3.5
    assert (
        parse_response({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "7"]}}) == 7.0
    )
    assert parse_response(vector()) is None


def test_an_error_carries_prometheus_own_type_and_message() -> None:
    body = {"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'}
    with pytest.raises(PromQLError, match='bad_data: parse error: unexpected "}"'):
        parse_response(body)
    with pytest.raises(PromQLError, match="vector or a scalar, not a matrix"):
        parse_response({"status": "success", "data": {"resultType": "matrix", "result": []}})
    with pytest.raises(PromQLError, match="gave nan"):
        parse_response(vector("NaN"))


def test_the_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="prometheus url must be http"):
        PrometheusSource("prometheus:9090")
