"""The whole system as a user runs it: `tessera up`, then the CLI."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.harness import ROOT, Stack

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

EXAMPLES = ROOT / "examples" / "jobs"


def test_every_service_is_ready(stack: Stack) -> None:
    import httpx

    services = json.loads((stack.state / "endpoints.json").read_text())["services"]
    assert set(services) == {"telemetry", "forecaster", "admission", "scheduler", "slicing", "checkpoint"}
    for service in services.values():
        assert httpx.get(service["ready_url"], timeout=5).status_code == 200, service["name"]


def test_the_ddp_example_is_queued_admitted_and_placed(stack: Stack) -> None:
    submitted = stack.tessera("jobs", "submit", str(EXAMPLES / "ddp-2x4.yaml"))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    deadline = time.monotonic() + 120  # a bound on the wait, not a speed goal (B3 measures that)
    state = ""
    while time.monotonic() < deadline:
        shown = stack.tessera("jobs", "get", job_id, "--json")
        state = json.loads(shown.stdout)["state"]
        if state in ("placed", "running"):
            break
        time.sleep(0.5)
    assert state in ("placed", "running")
    history = [step["state"] for step in json.loads(shown.stdout)["history"]]
    assert history[:4] == ["submitted", "queued", "admitted", "placed"]


def test_the_invalid_example_is_rejected_naming_the_field(stack: Stack) -> None:
    result = stack.tessera("jobs", "submit", str(EXAMPLES / "invalid.yaml"))
    assert result.returncode == 1
    assert "rejected" in result.stderr and "None" not in result.stderr  # an invalid spec is not stored
    assert "name: must be a DNS label" in result.stderr
    assert "pod_groups[0]: min_available (3) exceeds replicas (2)" in result.stderr
