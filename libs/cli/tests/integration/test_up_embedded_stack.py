"""``tessera up`` end to end with stand-in services: endpoints, readiness, clean stop, data reuse."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import asyncpg  # type: ignore[import-untyped]
import httpx
import nats
import psutil  # type: ignore[import-untyped]
import pytest
import yaml
from nats.aio.client import Client as NATS

from tessera.cli.up import SERVICES

pytestmark = pytest.mark.integration

FAKE_STACK = Path(__file__).with_name("fake_stack.py")


class Up:
    """One ``tessera up`` run in a child process, its output captured to a file."""

    def __init__(self, state_dir: Path, services: str | None = None, **env: str) -> None:
        self.output_path = state_dir.parent / f"up-{time.monotonic_ns()}.out"
        self._out: IO[bytes] = self.output_path.open("wb")
        argv = [sys.executable, str(FAKE_STACK), "up", str(state_dir)] + ([services] if services else [])
        self.proc = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            start_new_session=True,
        )
        self.state_dir = state_dir

    @property
    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def endpoints(self, within: float = 180) -> dict[str, object]:
        path = self.state_dir / "endpoints.json"
        deadline = time.monotonic() + within
        while not path.exists():
            assert self.proc.poll() is None, f"tessera up exited early:\n{self.output}"
            assert time.monotonic() < deadline, f"no endpoints.json after {within}s:\n{self.output}"
            time.sleep(0.05)
        data: dict[str, object] = json.loads(path.read_text())
        return data

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self._out.close()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._out.close()


def processes_using(state_dir: Path) -> list[str]:
    """Command lines of live processes that mention the state directory (NATS, PostgreSQL, services)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(state_dir) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline)
    return found


def kubeconfig_of(state_dir: Path) -> str:
    """Where ``tessera up`` has the devcluster write its kubeconfig."""
    return str(state_dir.resolve() / "kubeconfig")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # under /tmp rather than pytest's private basetemp, which PostgreSQL's own user cannot traverse
    root = Path(tempfile.mkdtemp(prefix="tessera-up-test-"))
    root.chmod(0o755)
    yield root / "state"
    shutil.rmtree(root, ignore_errors=True)


def with_user(admin_url: str, user: str, state_dir: Path) -> str:
    password = json.loads((state_dir / "credentials" / "nats-users.json").read_text())[user]
    assert admin_url.startswith("nats://tessera-admin:")
    return f"nats://{user}:{password}@{admin_url.rpartition('@')[2]}"


def with_role(admin_url: str, role: str, state_dir: Path) -> str:
    password = json.loads((state_dir / "credentials" / "postgres-roles.json").read_text())[role]
    return f"postgresql://{role}:{password}@{admin_url.rpartition('@')[2]}"


async def _boots(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM boots"))
    finally:
        await conn.close()


async def test_up_serves_endpoints_stops_cleanly_and_reuses_its_data(state_dir: Path) -> None:
    first = Up(state_dir)
    try:
        endpoints = first.endpoints()
        services = endpoints["services"]
        assert isinstance(services, dict)
        assert sorted(services) == sorted(SERVICES)
        nats_url, database_url = str(endpoints["nats_url"]), str(endpoints["database_url"])
        assert nats_url.startswith("nats://tessera-admin:") and "@127.0.0.1:" in nats_url
        assert database_url.startswith("postgresql://") and "@127.0.0.1:" in database_url
        assert endpoints["admission_api_url"] == services["admission"]["base_url"]
        async with httpx.AsyncClient() as client:
            for name, ep in services.items():
                health = await client.get(ep["health_url"])
                assert health.status_code == 200
                # each service got its own port and the stack's URLs through its environment
                assert health.json()["service"] == name
                # each as its own NATS user and PostgreSQL role, on the stack's servers
                assert health.json()["nats_url"] == with_user(nats_url, f"tessera-{name}", state_dir)
                assert health.json()["database_url"] == with_role(database_url, f"tessera_{name}", state_dir)
                # the devcluster's kubeconfig, written before the services start
                assert health.json()["kubeconfig"] == kubeconfig_of(state_dir)
                assert (await client.get(ep["ready_url"])).status_code == 200
            assert endpoints["kubeconfig"] == kubeconfig_of(state_dir)
            devcluster = yaml.safe_load((state_dir / "kubeconfig").read_text())["clusters"][0]["cluster"]
            nodes = (await client.get(f"{devcluster['server']}/api/v1/nodes")).json()["items"]
            assert sorted(n["metadata"]["name"] for n in nodes) == [f"gpu-node-{i}" for i in range(4)]
        ports = json.loads((state_dir / "ports.json").read_text())
        assert nats_url.endswith(f":{ports['nats']}")
        assert f":{ports['postgres']}/" in database_url
        assert await _boots(database_url) == 1
        assert processes_using(state_dir)

        assert first.stop(signal.SIGTERM) == 0
    finally:
        first.kill()
    output = first.output
    assert "admission  | admission listening on" in output
    # services first, then NATS, then PostgreSQL
    assert output.index("scheduler  | scheduler stopped") < output.index("stopping nats")
    assert output.index("stopping nats") < output.index("stopping postgres")
    assert output.index("scheduler  | scheduler stopped") < output.index("stopping devcluster")
    assert output.index("stopping devcluster") < output.index("stopping nats")
    assert processes_using(state_dir) == []
    assert not (state_dir / "endpoints.json").exists()

    second = Up(state_dir, services="admission,scheduler")
    try:
        again = second.endpoints()
        assert again["database_url"] == database_url
        assert again["nats_url"] == nats_url
        assert isinstance(again["services"], dict) and sorted(again["services"]) == ["admission", "scheduler"]
        assert await _boots(database_url) == 2, "the second run must find the first run's data"
        assert second.stop(signal.SIGINT) == 0
    finally:
        second.kill()
    assert "reusing its data" in second.output
    assert processes_using(state_dir) == []


def test_a_second_up_on_the_same_state_dir_is_refused(state_dir: Path) -> None:
    first = Up(state_dir, services="admission")
    try:
        first.endpoints()
        second = subprocess.run(
            [sys.executable, str(FAKE_STACK), "up", str(state_dir), "admission"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1
        assert f"state directory {state_dir.resolve()} is in use by pid {first.proc.pid}" in second.stdout
        assert first.stop() == 0
    finally:
        first.kill()


def test_a_service_that_never_gets_ready_is_named_with_its_log_file(state_dir: Path) -> None:
    # without the devcluster, whose own start may take longer than these 2 s on a busy machine
    run = Up(
        state_dir,
        services="admission,slicing",
        FAKE_NOT_READY="slicing",
        FAKE_READY_TIMEOUT="2",
        FAKE_DEVCLUSTER="0",
    )
    try:
        code = run.proc.wait(timeout=60)
    finally:
        run.kill()
    assert code == 1
    output = " ".join(run.output.split())  # undo the console's line wrapping
    assert "error: slicing: not ready after 2s" in output
    assert str(state_dir.resolve() / "logs" / "slicing.log") in output.replace(" ", "")
    assert processes_using(state_dir) == []


def test_a_failing_migration_stops_the_start_and_is_named(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from tessera.cli.up import UpOptions, run_up

    def failing_migrate(url: str) -> None:
        raise RuntimeError(f"cannot reach {url}")

    out = io.StringIO()
    code = run_up(
        UpOptions(
            state_dir=tmp_path / "state",
            nats_url="nats://127.0.0.1:1",
            database_url="postgresql://u:p@127.0.0.1:1/db",
        ),
        console=Console(file=out, width=200),
        migrate=failing_migrate,
        service_argv=lambda n: [sys.executable, "-c", "raise SystemExit('must not start')"],
    )

    assert code == 1
    assert "error: migrations: RuntimeError: cannot reach postgresql://u:p@127.0.0.1:1/db" in out.getvalue()
    assert "must not start" not in out.getvalue()
    assert not (tmp_path / "state" / "endpoints.json").exists()


def test_a_devcluster_that_dies_is_restarted_with_its_objects(state_dir: Path) -> None:
    run = Up(state_dir, services="admission")
    try:
        run.endpoints()
        kubeconfig = state_dir / "kubeconfig"
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        created = httpx.post(
            f"{server}/api/v1/namespaces/default/configmaps",
            json={"metadata": {"name": "kept"}, "data": {"a": "1"}},
        )
        assert created.status_code == 201, created.text
        snapshot = state_dir / "devcluster" / "state.json"
        deadline = time.monotonic() + 30
        while not (snapshot.exists() and '"kept"' in snapshot.read_text()):
            assert time.monotonic() < deadline, "the devcluster never wrote its state file"
            time.sleep(0.1)
        (devcluster,) = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "tessera.devcluster" in " ".join(p.info["cmdline"] or [])
            and str(state_dir) in " ".join(p.info["cmdline"])
        ]
        devcluster.kill()
        deadline = time.monotonic() + 90
        while "devcluster | restarted (pid" not in " ".join(run.output.split()):
            assert run.proc.poll() is None, run.output
            assert time.monotonic() < deadline, run.output
            time.sleep(0.1)
        kept = httpx.get(f"{server}/api/v1/namespaces/default/configmaps/kept")
        assert kept.status_code == 200 and kept.json()["data"] == {"a": "1"}
        assert run.stop() == 0
    finally:
        run.kill()
    output = " ".join(run.output.split())
    assert "devcluster | exited with code -9; restart #1 in" in output
    assert processes_using(state_dir) == []


async def test_up_runs_nats_with_users_and_gives_each_tenant_of_the_queues_its_credentials(
    state_dir: Path,
) -> None:
    run = Up(state_dir, services="admission", FAKE_DEVCLUSTER="0")
    try:
        endpoints = run.endpoints()
        nats_url, database_url = str(endpoints["nats_url"]), str(endpoints["database_url"])
        server = "nats://" + nats_url.rpartition("@")[2]
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(server, allow_reconnect=False, max_reconnect_attempts=0)
        credentials = state_dir / "credentials"
        for secret in ("nats.conf", "nats-users.json", "postgres-roles.json"):
            assert stat.S_IMODE((credentials / secret).stat().st_mode) == 0o600, secret

        # a tenant of the queue configuration gets its NATS user while the stack runs
        admin = await asyncpg.connect(database_url)
        try:
            await admin.execute("CREATE SCHEMA IF NOT EXISTS admission")
            await admin.execute(
                "CREATE TABLE IF NOT EXISTS admission.tenant_queues (tenant text PRIMARY KEY, queue text)"
            )
            await admin.execute("INSERT INTO admission.tenant_queues VALUES ('team-a', 'q')")
        finally:
            await admin.close()
        tenant_file = credentials / "tenants" / "team-a.json"
        deadline = time.monotonic() + 60
        while not tenant_file.exists():
            assert time.monotonic() < deadline, run.output
            await asyncio.sleep(0.1)
        assert stat.S_IMODE(tenant_file.stat().st_mode) == 0o600
        tenant = json.loads(tenant_file.read_text())
        assert tenant["subject"] == "tessera.admission.cmd.submit_job.team-a"

        errors: list[str] = []

        async def heard(exc: Exception) -> None:
            errors.append(str(exc).lower())

        async def connected() -> NATS:
            while True:  # the server reloads its configuration just after the file is written
                try:
                    return await nats.connect(
                        tenant["url"],
                        inbox_prefix=tenant["inbox_prefix"],
                        error_cb=heard,
                        allow_reconnect=False,
                    )
                except (nats.errors.Error, OSError):  # refused, or reset while being refused
                    await asyncio.sleep(0.1)

        nc = await asyncio.wait_for(connected(), 30)
        errors.clear()  # what the refused attempts reported
        try:
            await nc.publish(tenant["subject"], b"{}")
            await nc.publish("tessera.admission.cmd.submit_job.team-b", b"{}")
            await nc.flush()
            deadline = time.monotonic() + 10
            while not errors:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
        finally:
            await nc.close()
        assert errors == [
            'nats: permissions violation for publish to "tessera.admission.cmd.submit_job.team-b"'
        ]
        assert "users for tenants team-a written" in " ".join(run.output.split())
        assert run.stop() == 0
    finally:
        run.kill()
