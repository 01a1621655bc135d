"""`tessera usage`: tables and JSON from telemetry's GET /v1/usage, and the PNG report of allocated
vs used GPUs over time from GET /v1/usage/series."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tessera.cli import usage
from tessera.cli.main import app

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
BODY: dict[str, Any] = {
    "by": "tenant",
    "from": "2026-11-22T12:00:00+00:00",
    "to": "2026-11-23T12:00:00+00:00",
    "tenant": None,
    "currency": "USD",
    "rows": [
        {
            "group": "team-a",
            "tenant": "",
            "queue": "",
            "allocated_gpu_hours": 48.0,
            "used_gpu_hours": 30.5,
            "idle_gpu_hours": 6.0,
            "memory_gib_hours": 900.0,
            "cost": 196.8,
            "utilisation_pct": 63.54,
        },
        {
            "group": "team-b",
            "tenant": "",
            "queue": "",
            "allocated_gpu_hours": 12.0,
            "used_gpu_hours": 1.2,
            "idle_gpu_hours": 9.5,
            "memory_gib_hours": 40.0,
            "cost": 49.2,
            "utilisation_pct": 10.0,
        },
    ],
    "top_wasters": [
        {
            "group": "job-7",
            "tenant": "team-b",
            "queue": "serving",
            "allocated_gpu_hours": 12.0,
            "used_gpu_hours": 1.2,
            "idle_gpu_hours": 9.5,
            "memory_gib_hours": 40.0,
            "cost": 49.2,
            "utilisation_pct": 10.0,
        },
    ],
}


def _points(allocated: list[float], used: list[float]) -> list[dict[str, Any]]:
    return [
        {
            "hour": (NOW - timedelta(hours=len(allocated) - i)).isoformat(),
            "allocated_gpus": a,
            "used_gpus": u,
            "idle_gpus": 0.0,
        }
        for i, (a, u) in enumerate(zip(allocated, used, strict=True))
    ]


SERIES: dict[str, Any] = {
    "by": "tenant",
    "from": "2026-11-23T09:00:00+00:00",
    "to": "2026-11-23T12:00:00+00:00",
    "tenant": None,
    "currency": "USD",
    "series": [
        {
            "group": "team-a",
            "allocated_gpu_hours": 24.0,
            "used_gpu_hours": 15.0,
            "cost": 98.4,
            "points": _points([8.0, 8.0, 8.0], [6.0, 5.0, 4.0]),
        },
        {
            "group": "other",
            "allocated_gpu_hours": 3.0,
            "used_gpu_hours": 0.3,
            "cost": 12.3,
            "points": _points([2.0, 1.0, 0.0], [0.2, 0.1, 0.0]),
        },
    ],
}


@pytest.fixture
def telemetry(monkeypatch: pytest.MonkeyPatch) -> list[httpx.Request]:
    asked: list[httpx.Request] = []

    def get(url: str, params: dict[str, Any], headers: dict[str, str], timeout: float) -> httpx.Response:
        request = httpx.Request("GET", url, params=params, headers=headers)
        asked.append(request)
        body = SERIES if url.endswith("/v1/usage/series") else BODY
        return httpx.Response(200, json=body, request=request)

    monkeypatch.setattr(usage.httpx, "get", get)
    monkeypatch.setenv("TESSERA_TELEMETRY_URL", "http://telemetry:8081")
    monkeypatch.setenv("TESSERA_TOKEN", "tsr_team-a")
    return asked


def test_ages_and_iso_times() -> None:
    assert usage.parse_time("24h", NOW) == NOW - timedelta(hours=24)
    assert usage.parse_time("-7d", NOW) == NOW - timedelta(days=7)
    assert usage.parse_time("2026-11-01T00:00", NOW) == datetime(2026, 11, 1, tzinfo=UTC)


def test_the_table_shows_allocated_used_idle_and_cost_and_the_top_wasters(
    telemetry: list[httpx.Request],
) -> None:
    result = CliRunner().invoke(app, ["usage", "--by", "tenant", "--from", "24h"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    for text in (
        "team-a",
        "48.00",
        "30.50",
        "196.80",
        "Top wasters",
        "job-7",
        "total: 60.00 GPU-h allocated",
    ):
        assert text in result.output
    (request,) = telemetry
    assert request.url.path == "/v1/usage" and request.url.params["by"] == "tenant"
    assert request.headers["Authorization"] == "Bearer tsr_team-a"


def test_json_prints_telemetrys_answer(telemetry: list[httpx.Request]) -> None:
    result = CliRunner().invoke(app, ["usage", "--by", "job", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rows"][0]["group"] == "team-a"
    assert telemetry[0].url.params["by"] == "job"


def test_report_plots_allocated_and_used_gpus_over_time(
    telemetry: list[httpx.Request], tmp_path: Path
) -> None:
    out = tmp_path / "usage.png"
    result = CliRunner().invoke(app, ["usage", "report", "--png", str(out), "--top", "3", "--from", "3h"])
    assert result.exit_code == 0, result.output
    (request,) = telemetry
    assert request.url.path == "/v1/usage/series" and request.url.params["top"] == "3"
    from PIL import Image

    with Image.open(out) as image:
        assert image.format == "PNG" and image.size == (1000, 500)
        # not a blank canvas: the lines and legend put many colours on it
        assert len(image.convert("RGB").getcolors(maxcolors=1_000_000) or []) > 50


def test_the_series_data_reaches_the_plot(tmp_path: Path) -> None:
    plotted = usage.write_series_png(SERIES, tmp_path / "usage.png")
    assert plotted["team-a/allocated"] == [8.0, 8.0, 8.0]
    assert plotted["team-a/used"] == [6.0, 5.0, 4.0]
    assert plotted["other/allocated"] == [2.0, 1.0, 0.0]
    assert plotted["other/used"] == [0.2, 0.1, 0.0]
    empty = usage.write_series_png({**SERIES, "series": []}, tmp_path / "empty.png")
    assert empty == {} and (tmp_path / "empty.png").stat().st_size > 0


def test_report_json_prints_the_series(telemetry: list[httpx.Request]) -> None:
    result = CliRunner().invoke(app, ["usage", "report", "--json"])
    assert result.exit_code == 0, result.output
    assert [s["group"] for s in json.loads(result.output)["series"]] == ["team-a", "other"]


def test_report_without_an_output_says_what_to_give() -> None:
    result = CliRunner().invoke(app, ["usage", "report"], env={"COLUMNS": "200"})
    assert result.exit_code != 0
    assert "give --png FILE, --json, or both" in result.output


def test_an_unknown_grouping_is_refused() -> None:
    result = CliRunner().invoke(app, ["usage", "--by", "colour"])
    assert result.exit_code != 0


def test_a_refusal_names_the_field_and_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    refusal = {"detail": [{"loc": ["query", "from"], "msg": "must be before to", "type": "value_error"}]}

    def get(url: str, params: dict[str, Any], headers: dict[str, str], timeout: float) -> httpx.Response:
        return httpx.Response(422, json=refusal, request=httpx.Request("GET", url))

    monkeypatch.setattr(usage.httpx, "get", get)
    monkeypatch.setenv("TESSERA_TELEMETRY_URL", "http://telemetry:8081")
    result = CliRunner().invoke(app, ["usage", "--from", "1h", "--to", "2026-01-01T00:00"])
    assert result.exit_code == 1
    assert "error 422: from: must be before to" in " ".join(result.output.split())
