"""The whole system as a user runs it: `tessera up`, then the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "jobs"


def tessera(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, str], Path]]:
    state = tmp_path_factory.mktemp("tessera-up")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    log = (state / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera.cli", "up", "--state-dir", str(state)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    endpoints = state / "endpoints.json"
    deadline = time.monotonic() + 120
    while not endpoints.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(
                f"tessera up did not become ready in 120 s:\n{(state / 'up.log').read_text()[-4000:]}"
            )
        time.sleep(0.5)
    api = json.loads(endpoints.read_text())["admission_api_url"]
    yield {**env, "TESSERA_ADMISSION_URL": api}, state
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("tessera up did not stop within 60 s of Ctrl-C")
    assert code == 0, (state / "up.log").read_text()[-3000:]


def test_every_service_is_ready(stack: tuple[dict[str, str], Path]) -> None:
    import httpx

    _, state = stack
    services = json.loads((state / "endpoints.json").read_text())["services"]
    assert set(services) == {"telemetry", "forecaster", "admission", "scheduler", "slicing", "checkpoint"}
    for service in services.values():
        assert httpx.get(service["ready_url"], timeout=5).status_code == 200, service["name"]


def test_the_ddp_example_is_placed_within_30_seconds(stack: tuple[dict[str, str], Path]) -> None:
    env, _ = stack
    submitted = tessera("jobs", "submit", str(EXAMPLES / "ddp-2x4.yaml"), env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    deadline = time.monotonic() + 30
    state = ""
    while time.monotonic() < deadline:
        shown = tessera("jobs", "get", job_id, "--json", env=env)
        state = json.loads(shown.stdout)["state"]
        if state in ("placed", "running"):
            break
        time.sleep(0.5)
    assert state in ("placed", "running")
    history = [step["state"] for step in json.loads(shown.stdout)["history"]]
    assert history[:4] == ["submitted", "queued", "admitted", "placed"]


def test_the_invalid_example_is_rejected_naming_the_field(stack: tuple[dict[str, str], Path]) -> None:
    env, _ = stack
    result = tessera("jobs", "submit", str(EXAMPLES / "invalid.yaml"), env=env)
    assert result.returncode == 1
    assert "rejected" in result.stderr
    assert "name: must be a DNS label" in result.stderr
    assert "pod_groups[0]: min_available (3) exceeds replicas (2)" in result.stderr
