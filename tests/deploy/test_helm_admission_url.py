"""The services that check tenants' bearer tokens with admission find it in the release by default."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.chart import RELEASE, VALUE_SETS, merged, render

ASKING = {"telemetry": "DaemonSet", "checkpoint": "Deployment", "forecaster": "Deployment"}


def env_of(workload: dict[str, Any]) -> dict[str, list[str]]:
    """Each variable's values (a list, so a variable set twice shows)."""
    found: dict[str, list[str]] = {}
    for container in workload["spec"]["template"]["spec"]["containers"]:
        for item in container.get("env", []):
            found.setdefault(item["name"], []).append(item.get("value", ""))
    return found


@pytest.mark.parametrize("service", sorted(ASKING))
def test_the_admission_url_defaults_to_the_release_admission_service(service: str) -> None:
    rendered = render(VALUE_SETS["default"])
    admission = rendered.get("Service", f"{RELEASE}-admission")
    port = next(p["port"] for p in admission["spec"]["ports"] if p["name"] == "http")
    workload = rendered.get(ASKING[service], f"{RELEASE}-{service}")
    assert env_of(workload)[f"TESSERA_{service.upper()}_ADMISSION_URL"] == [
        f"http://{RELEASE}-admission:{port}"
    ]


@pytest.mark.parametrize("service", sorted(ASKING))
def test_a_set_admission_url_is_the_only_one(service: str) -> None:
    url = "https://admission.example:9000"
    values = merged(VALUE_SETS["default"], {service: {"settings": {"admission_url": url}}})
    workload = render(values).get(ASKING[service], f"{RELEASE}-{service}")
    assert env_of(workload)[f"TESSERA_{service.upper()}_ADMISSION_URL"] == [url]


def test_services_that_do_not_ask_admission_get_no_admission_url() -> None:
    rendered = render(VALUE_SETS["default"])
    for service in ("scheduler", "slicing", "admission"):
        for workload in rendered.of_kind("Deployment", "DaemonSet"):
            if workload["metadata"]["name"] == f"{RELEASE}-{service}":
                assert f"TESSERA_{service.upper()}_ADMISSION_URL" not in env_of(workload)
