"""`tessera up` rides out outages: NATS and PostgreSQL killed with SIGKILL come back and jobs go on;
a restarted `tessera up` finds its devcluster's pods still running, and the jobs with them.

This test runs a stack of its own (it kills parts of it), beside the session's shared one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import kubernetes
import psutil  # type: ignore[import-untyped]
import pytest

from tests.e2e.harness import ROOT, until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

DDP = ROOT / "examples" / "jobs" / "ddp-2x4.yaml"


class OwnStack:
    """One `tessera up` on a state directory of its own; started again on the same one by `restart`."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "OTEL_"))},
            "TESSERA_STATE_DIR": str(state),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.runs = 0

    @property
    def log_path(self) -> Path:
        return self.state.parent / f"up-{self.runs}.log"

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self) -> None:
        self.runs += 1
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tessera.cli", "up", "--devcluster-speed", "10"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,
        )
        until(lambda: self._ready(), "tessera up to be ready", timeout=180)

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (
            f"tessera up exited:\n{self.output[-4000:]}"
        )
        return "Tessera is up" in self.output and (self.state / "endpoints.json").exists()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                assert self.proc.wait(timeout=90) == 0, self.output[-3000:]
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()
        if self._log is not None:
            self._log.close()

    def child(self, name: str) -> psutil.Process:
        assert self.proc is not None
        for proc in psutil.Process(self.proc.pid).children():
            if proc.name() == name and proc.status() != psutil.STATUS_ZOMBIE:
                return proc
        raise AssertionError(f"no {name} under tessera up:\n{self.output[-3000:]}")

    def tessera(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tessera.cli", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            cwd=ROOT,
        )

    def job(self, job_id: str) -> dict[str, Any]:
        shown = self.tessera("jobs", "get", job_id, "--json")
        if shown.returncode != 0:
            return {"state": f"unreadable: {shown.stderr.strip()}"}
        job: dict[str, Any] = json.loads(shown.stdout)
        return job

    def pods(self) -> dict[str, str]:
        """uid -> phase of the devcluster's pods of jobs, through the official client."""
        with kubernetes.config.new_client_from_config(str(self.state / "kubeconfig")) as api:
            pods = kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces().items
        return {
            p.metadata.uid: p.status.phase for p in pods if "tessera.io/job-id" in (p.metadata.labels or {})
        }

    def submit(self) -> str:
        result = until(
            lambda: (r := self.tessera("jobs", "submit", str(DDP))).returncode == 0 and r,
            "a submit to be accepted",
            timeout=90,
        )
        return str(result.stdout.strip())


@pytest.fixture
def own_stack() -> Iterator[OwnStack]:
    # under /tmp rather than pytest's basetemp: pytest may set that back to 0700 while the test runs,
    # and PostgreSQL's own user could then no longer reach its data for a restart
    root = Path(tempfile.mkdtemp(prefix="tessera-up-outages-"))
    root.chmod(0o755)
    stack = OwnStack(root / "state")
    try:
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_nats_and_postgres_killed_then_a_restart_of_tessera_up(own_stack: OwnStack) -> None:
    own_stack.start()
    first = own_stack.submit()
    until(lambda: own_stack.job(first)["state"] == "running", f"job {first} running", timeout=90)

    for name in ("nats-server", "postgres"):
        os.kill(own_stack.child(name).pid, signal.SIGKILL)
    for name in ("nats", "postgres"):
        until(
            lambda name=name: re.search(
                rf"{name} +\| restarted \(pid \d+\) and ready again", own_stack.output
            ),
            f"{name} restarted",
            timeout=90,
        )

    # a job submitted after the outage goes through, and the first one is still running
    second = own_stack.submit()
    until(lambda: own_stack.job(second)["state"] == "running", f"job {second} running", timeout=120)
    assert own_stack.job(first)["state"] == "running"

    # a stop and a start of tessera up: the devcluster's pods are the same pods, still running, and
    # the jobs with them
    before = own_stack.pods()
    assert before and set(before.values()) == {"Running"}, before
    own_stack.stop()
    own_stack.start()
    assert own_stack.pods() == before
    until(lambda: own_stack.job(first)["state"] == "running", f"job {first} still running", timeout=60)
    assert own_stack.job(second)["state"] == "running", own_stack.job(second)["history"]
