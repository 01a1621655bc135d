"""Run services for tests: in process (fast, for traces) or as real processes (for crash tests)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import nats
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DeliverPolicy

from tessera.core.embedded import free_port
from tessera.core.messaging.envelope import Envelope, decode
from tessera.core.runner import RunningService, ServiceDefinition, start_context
from tessera.core.settings import ServiceSettings

S = TypeVar("S", bound=ServiceSettings)

FAST = {"outbox_poll_s": 0.05, "consumer": {"ack_wait_s": 5.0, "backoff_base_s": 0.1, "backoff_max_s": 1.0}}


def settings_for(cls: type[S], nats_url: str, database_url: str, **overrides: Any) -> S:
    values: dict[str, Any] = {"nats_url": nats_url, "database_url": database_url, **FAST, **overrides}
    return cls.model_validate(values)


@asynccontextmanager
async def running(
    definition: ServiceDefinition[Any], settings: ServiceSettings
) -> AsyncIterator[RunningService[Any]]:
    ctx = await start_context(definition, settings)
    service = RunningService(definition, ctx)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


async def reset_jetstream(nats_url: str) -> None:
    """Delete every stream, so each test starts from an empty JetStream."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for name in await js.streams_info():
            await js.delete_stream(name.config.name or "")
    finally:
        await nc.close()


async def read_messages(js: JetStreamContext, subject: str, *, idle_s: float = 0.5) -> list[Msg]:
    """Every message stored under `subject` (an ordered ephemeral consumer from the start)."""
    out: list[Msg] = []
    sub = await js.subscribe(subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
    try:
        while True:
            try:
                out.append(await sub.next_msg(timeout=idle_s))
            except TimeoutError:
                return out
    finally:
        await sub.unsubscribe()


async def read_stream(js: JetStreamContext, subject: str, *, idle_s: float = 0.5) -> list[Envelope]:
    """Every message stored under `subject`, decoded."""
    return [decode(m.subject, m.headers, m.data) for m in await read_messages(js, subject, idle_s=idle_s)]


async def eventually(
    probe: Any, *, timeout: float = 45.0, interval: float = 0.1, what: str = "condition"
) -> Any:
    """Poll an async probe until it returns a truthy value; fail naming what was awaited. The default
    wait is long enough for a loaded 2-core CI machine; a passing test never waits it out."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


class ServiceProcess:
    """A service as a real process (`python -m tessera.<service>`), so that a test can SIGKILL it."""

    def __init__(self, service: str, env: Mapping[str, str], log_dir: Path) -> None:
        self.service = service
        self.port = free_port()
        self.env = {**os.environ, **env, f"TESSERA_{service.upper()}_HTTP_PORT": str(self.port)}
        self.log_path = log_dir / f"{service}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, extra_env: Mapping[str, str] | None = None) -> None:
        env = {**self.env, **(extra_env or {})}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", f"tessera.{self.service}"], env=env, stdout=log, stderr=subprocess.STDOUT
        )

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    raise AssertionError(
                        f"{self.service} exited with {self.proc.returncode}; log:\n"
                        f"{self.log_path.read_text()[-3000:]}"
                    )
                try:
                    if (await client.get(f"{self.url}/readyz", timeout=2)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise AssertionError(
            f"{self.service} not ready in {timeout}s; log:\n{self.log_path.read_text()[-3000:]}"
        )

    async def wait_exit(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.service} still running after {timeout}s")
            await asyncio.sleep(0.05)
        return self.proc.returncode

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
