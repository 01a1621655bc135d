"""One `tessera up` (with its devcluster) shared by every end-to-end test, and helpers to drive it.

Every service exports its spans to the session's OTLP collector (``tessera up --otlp-endpoint``),
so a test can read a job's whole trace from ``stack.traces``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tessera.testing.otlp import OtlpCollector

ROOT = Path(__file__).parents[2]
KUBECTL_HINT = (
    "kubectl is a binary dependency of this test and was not found on PATH (e.g. /usr/bin/kubectl); "
    "install it from the pkgs.k8s.io apt repository or https://dl.k8s.io/release/v1.31.0/bin/linux/amd64/kubectl"
)


@dataclass(frozen=True)
class Stack:
    state: Path
    env: dict[str, str]
    kubeconfig: Path
    nats_url: str
    kubectl_path: str
    traces: OtlpCollector
    """What every service exported (spans of every test: select by trace id or job id)."""

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=stdin,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
        return result.stdout

    def tessera(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tessera.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            cwd=ROOT,
        )

    def node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = json.loads(self.kubectl("get", "node", name, "-o", "json"))
        return node


def until(probe: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


# The services' batch span processors export every 200 ms instead of every 5 s.
EXPORT_DELAY_MS = "200"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory, otlp_collector: OtlpCollector) -> Iterator[Stack]:
    kubectl_path = shutil.which("kubectl")
    if kubectl_path is None:
        pytest.fail(KUBECTL_HINT)
    state = tmp_path_factory.mktemp("tessera-up-devcluster")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "OTEL_"))},
        "OTEL_BSP_SCHEDULE_DELAY": EXPORT_DELAY_MS,
        # a GPU held idle for 20 s is flagged (600 s in production), so the usage test sees one in time;
        # the window spans several 5 s samples, so one sample taken while a pod starts flags nothing
        "TESSERA_TELEMETRY_USAGE__IDLE_WINDOW_S": "20",
        # the forecaster steps a second (a trace minute replayed per second) over an hour of history,
        # and reconciles PredictiveAutoscalers each second, for the closed-loop test
        "TESSERA_FORECASTER_STEP_S": "1",
        "TESSERA_FORECASTER_HISTORY_H": "1",
        "TESSERA_FORECASTER_CONTROLLER_INTERVAL_S": "1",
    }
    log = (state / "up.log").open("w")
    command = [sys.executable, "-m", "tessera.cli", "up", "--state-dir", str(state)]
    command += ["--devcluster-speed", "10", "--otlp-endpoint", otlp_collector.endpoint]
    proc = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=ROOT,
    )
    endpoints_file = state / "endpoints.json"
    deadline = time.monotonic() + 120
    while not endpoints_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(
                f"tessera up did not become ready in 120 s:\n{(state / 'up.log').read_text()[-4000:]}"
            )
        time.sleep(0.5)
    endpoints = json.loads(endpoints_file.read_text())
    kubeconfig = Path(endpoints["kubeconfig"])
    env = {**env, "TESSERA_ADMISSION_URL": endpoints["admission_api_url"]}
    yield Stack(state, env, kubeconfig, endpoints["nats_url"], kubectl_path, otlp_collector)
    proc.send_signal(signal.SIGINT)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("tessera up did not stop within 60 s of Ctrl-C")
    assert code == 0, (state / "up.log").read_text()[-3000:]
    assert not kubeconfig.with_name("endpoints.json").exists()
