"""`tessera up` as a subprocess on a state directory of its own, for bench.chaos: start, find the
processes it supervises, kill them with SIGKILL, stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import psutil  # type: ignore[import-untyped]

from tessera.core.embedded.endpoints import Endpoints, read_endpoints

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("admission", "scheduler", "telemetry", "forecaster", "slicing", "checkpoint")
INFRA = {"nats": "nats-server", "postgres": "postgres"}
"""Fault kind -> the process name of the server `tessera up` started."""


class StackError(RuntimeError):
    pass


class UpStack:
    """One `tessera up` in `state` (with its devcluster), its output in `state.parent/up.log`."""

    def __init__(self, state: Path, devcluster_speed: float = 10.0) -> None:
        self.state = state
        self.log_path = state.parent / "up.log"
        self.speed = devcluster_speed
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "OTEL_"))},
            "TESSERA_STATE_DIR": str(state),
            # each service's bytecode compiled once, at its first start, and read at every restart,
            # as from an installed image; a development shell's PYTHONDONTWRITEBYTECODE would make
            # every restart compile every module again (the kubernetes client's thousands of them)
            "PYTHONPYCACHEPREFIX": str(state.parent / "pycache"),
        }
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.endpoints: Endpoints | None = None

    # -- life -----------------------------------------------------------------------------------------
    def start(self, timeout: float = 600.0) -> Endpoints:
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            # a busy machine (the soak shares it) can take over a minute to start a service
            [
                sys.executable,
                "-m",
                "tessera.cli",
                "up",
                "--devcluster-speed",
                str(self.speed),
                "--ready-timeout",
                "180",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StackError(f"tessera up exited with {self.proc.returncode}:\n{self.tail()}")
            if "Tessera is up" in self.output() and (self.state / "endpoints.json").exists():
                self.endpoints = read_endpoints(self.state / "endpoints.json")
                return self.endpoints
            time.sleep(0.5)
        raise StackError(f"tessera up not ready after {timeout:.0f}s:\n{self.tail()}")

    def stop(self, timeout: float = 90.0) -> int | None:
        """SIGINT, as Ctrl-C; SIGKILL to the whole tree if it does not stop in `timeout`."""
        code: int | None = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                code = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                for child in psutil.Process(self.proc.pid).children(recursive=True):
                    child.kill()
                self.proc.kill()
                self.proc.wait()
        elif self.proc is not None:
            code = self.proc.returncode
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    # -- output ---------------------------------------------------------------------------------------
    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:]

    def said_since(self, offset: int, pattern: str) -> bool:
        return re.search(pattern, self.output()[offset:]) is not None

    # -- processes ------------------------------------------------------------------------------------
    def _children(self) -> list[psutil.Process]:
        if self.proc is None or self.proc.poll() is not None:
            raise StackError(f"tessera up is not running:\n{self.tail()}")
        return [
            p
            for p in psutil.Process(self.proc.pid).children()
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ]

    def process(self, kind: str, name: str) -> psutil.Process | None:
        """The live process of a service (kind "service", name its name) or a server (kind
        "nats" or "postgres"), or None while it is being restarted."""
        for child in self._children():
            try:
                if kind == "service":
                    if f"tessera.{name}" in child.cmdline():
                        return child
                elif child.name() == INFRA[kind]:
                    return child
            except psutil.NoSuchProcess:
                continue
        return None

    def kill(self, kind: str, name: str) -> int:
        """SIGKILL the process; its pid."""
        proc = self.process(kind, name)
        if proc is None:
            raise StackError(f"no live {kind} {name} to kill")
        os.kill(proc.pid, signal.SIGKILL)
        return int(proc.pid)
