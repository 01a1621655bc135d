"""The replay benchmark's stack and watch (see ``bench.replay``): ``tessera up`` in a process of its own,
and every trace pod followed through the Kubernetes API until it is bound, or ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
TRACE_LABEL = "tessera.io/trace=openb"


@dataclass
class PodRecord:
    created_at: float | None = None
    bound_at: float | None = None
    node: str | None = None
    phase: str = "Pending"
    reason: str = ""


# -- the stack ------------------------------------------------------------------------------------------
class Stack:
    def __init__(
        self, state: Path, nodes: Path, speed: float, services: str, env: dict[str, str] | None = None
    ) -> None:
        self.state = state
        state.mkdir(parents=True, exist_ok=True)
        self.log = (state / "up.log").open("w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")} | (env or {})
        # `tessera up` as its command runs it, but on free ports: the fixed defaults may be taken
        options = (
            f"UpOptions(state_dir=Path({str(state)!r}), services=tuple({services!r}.split(',')), "
            f"cluster_file=Path({str(nodes)!r}), devcluster_speed={speed!r}, ready_timeout=180.0, "
            "use_default_ports=False)"
        )
        code = (
            "import sys; from pathlib import Path; from tessera.cli.up import UpOptions, run_up; "
            f"sys.exit(run_up({options}))"
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )

    def wait_ready(self, timeout: float = 240) -> dict[str, Any]:
        path = self.state / "endpoints.json"
        deadline = time.monotonic() + timeout
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.state / "up.log").read_text()[-3000:]
                raise RuntimeError(f"tessera up did not become ready:\n{tail}")
            time.sleep(0.5)
        endpoints: dict[str, Any] = json.loads(path.read_text())
        return endpoints

    def processes(self) -> dict[str, psutil.Process]:
        """The scheduler's and the devcluster's processes, by name."""
        found: dict[str, psutil.Process] = {}
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            cmdline = " ".join(child.cmdline())
            for name in ("tessera.scheduler", "tessera.devcluster", "tessera.admission", "tessera.telemetry"):
                if f"-m {name}" in cmdline:
                    found[name.split(".")[1]] = child
        return found

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


# -- watching and creating pods -------------------------------------------------------------------------
class PodWatch:
    """Records when each trace pod is bound and how it ends, from a watch on the API server (raw JSON)."""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self.pods: dict[str, PodRecord] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def created(self, name: str) -> None:
        with self.lock:
            self.pods.setdefault(name, PodRecord()).created_at = time.monotonic()

    def _run(self) -> None:
        version = ""
        path = f"{self.url}/api/v1/namespaces/{self.namespace}/pods"
        while not self._stop.is_set():
            params = {"watch": "1", "labelSelector": TRACE_LABEL, "timeoutSeconds": "5"}
            if version:
                params["resourceVersion"] = version
            try:
                with httpx.stream("GET", path, params=params, timeout=30) as response:
                    for line in response.iter_lines():
                        if not line:
                            continue
                        event = json.loads(line)
                        if event.get("type") == "ERROR":  # 410 Expired: list again from now
                            version = ""
                            break
                        version = event["object"]["metadata"]["resourceVersion"]
                        self._seen(event["object"])
            except httpx.HTTPError:
                time.sleep(0.2)

    def _seen(self, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        node = (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        with self.lock:
            record = self.pods.setdefault(pod["metadata"]["name"], PodRecord())
            if node and record.bound_at is None:
                record.bound_at, record.node = now, node
            if status.get("phase"):
                record.phase = status["phase"]
                record.reason = status.get("reason", "")

    def counts(self) -> tuple[int, int]:
        with self.lock:
            bound = sum(1 for r in self.pods.values() if r.bound_at is not None)
            ended = sum(1 for r in self.pods.values() if r.phase in ("Succeeded", "Failed"))
            return bound, ended

    def stop(self) -> None:
        self._stop.set()
