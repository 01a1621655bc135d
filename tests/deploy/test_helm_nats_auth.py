"""The chart's NATS users: the permissions file is the code's table, and the evaluation NATS, run from
the rendered StatefulSet's arguments and Secret by a real nats-server, lets each service and tenant do
only its own work."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import nats
import nats.errors
import pytest
from helm_python.errors import HelmRenderError

from tessera.contracts import subjects
from tessera.core.embedded.nats import nats_server_binary
from tessera.core.messaging.permissions_export import render as permissions_file
from tests.deploy.chart import VALUE_SETS, merged, render
from tests.deploy.chart_schema import CHART

pytestmark = pytest.mark.integration


def test_the_permissions_file_is_the_code_s_table() -> None:
    written = (CHART / "files" / "nats-permissions.json").read_text()
    assert written == permissions_file(), (
        "write it again: uv run --frozen python -m tessera.core.messaging.permissions_export "
        "> helm/tessera/files/nats-permissions.json"
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def evaluation() -> tuple[dict[str, Any], list[str]]:
    """The evaluation chart's NATS users Secret and its nats-server arguments, with team-a a tenant."""
    chart = render(merged(VALUE_SETS["evaluation"], {"evaluation": {"nats": {"tenants": ["team-a"]}}}))
    secret = chart.get("Secret", "tessera-nats-users")["stringData"]
    statefulset = chart.get("StatefulSet", "tessera-nats")["spec"]["template"]["spec"]
    (container,) = statefulset["containers"]
    (volume,) = [v for v in statefulset["volumes"] if "secret" in v]
    assert volume["secret"] == {
        "secretName": "tessera-nats-users",
        "items": [{"key": "auth.conf", "path": "auth.conf"}],
    }
    rendered = json.dumps([o for o in chart.objects if o["kind"] != "Secret"])
    assert all(p not in rendered for k, p in secret.items() if k != "auth.conf"), (
        "a password outside its Secret"
    )
    return secret, list(container["args"])


@pytest.fixture(scope="module")
def server(
    evaluation: tuple[dict[str, Any], list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """nats-server with the StatefulSet's arguments, its files and ports moved to this machine."""
    secret, args = evaluation
    root = tmp_path_factory.mktemp("nats")
    (root / "auth.conf").write_text(secret["auth.conf"])
    moved = {
        "/data": str(root / "data"),
        "/etc/nats/auth.conf": str(root / "auth.conf"),
        "8222": str(_free_port()),
    }
    port = _free_port()
    command = [
        str(nats_server_binary()),
        *(moved.get(a, a) for a in args),
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        for _ in range(200):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            asyncio.run(asyncio.sleep(0.05))
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)


async def _violations(url: str, inbox_prefix: str, publish: list[str]) -> list[str]:
    """What the server says about `publish`-ing each subject as the URL's user."""
    heard: list[str] = []

    async def error(exc: Exception) -> None:
        heard.append(str(exc).lower())

    nc = await nats.connect(url, inbox_prefix=inbox_prefix, error_cb=error, allow_reconnect=False)
    try:
        for subject in publish:
            await nc.publish(subject, b"{}")
        await nc.flush()
        await asyncio.sleep(0.3)  # the server's -ERR for a refused publish comes asynchronously
    finally:
        await nc.close()
    return heard


def test_each_service_may_publish_its_own_subjects_only(
    evaluation: tuple[dict[str, Any], list[str]], server: str
) -> None:
    secret, _ = evaluation
    assert set(secret) == {
        "admin",
        "auth.conf",
        "tenant-team-a",
        *json.loads((CHART / "files" / "nats-permissions.json").read_text())["services"],
    }
    scheduler = f"nats://tessera-scheduler:{secret['scheduler']}@{server}"
    heard = asyncio.run(
        _violations(
            scheduler, "_INBOX_tessera-scheduler", ["tessera.scheduler.evt.gang_placed", subjects.SUBMIT_JOB]
        )
    )
    assert heard == [f'nats: permissions violation for publish to "{subjects.SUBMIT_JOB}"']


def test_a_tenant_may_publish_its_submit_subject_only(
    evaluation: tuple[dict[str, Any], list[str]], server: str
) -> None:
    secret, _ = evaluation
    tenant = f"nats://tenant-team-a:{secret['tenant-team-a']}@{server}"
    mine, theirs = subjects.tenant_submit_job("team-a"), subjects.tenant_submit_job("team-b")
    heard = asyncio.run(_violations(tenant, "_INBOX_tenant-team-a", [mine, theirs]))
    assert heard == [f'nats: permissions violation for publish to "{theirs}"']


def test_a_wrong_password_is_refused_and_the_admin_has_jetstream(
    evaluation: tuple[dict[str, Any], list[str]], server: str
) -> None:
    secret, _ = evaluation

    async def attempt() -> None:
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(f"nats://tessera-scheduler:wrong@{server}", allow_reconnect=False)
        admin = await nats.connect(f"nats://tessera-admin:{secret['admin']}@{server}", allow_reconnect=False)
        try:
            info = await admin.jetstream().account_info()  # -js still holds beside -c
            assert info.limits is not None
        finally:
            await admin.close()

    asyncio.run(attempt())


def test_passwords_are_random_and_one_per_user(evaluation: tuple[dict[str, Any], list[str]]) -> None:
    secret, _ = evaluation
    passwords = [v for k, v in secret.items() if k != "auth.conf"]
    assert len(set(passwords)) == len(passwords) and all(len(p) == 32 for p in passwords)


def test_own_nats_without_a_password_secret_is_refused_with_what_to_set() -> None:
    values = {"global": {"nats": {"url": "nats://n:4222"}, "database": {"url": "postgresql://u:p@db/t"}}}
    with pytest.raises(HelmRenderError, match=re.escape("global.nats.auth.existingSecret is required")):
        render(values)
    plain = render(merged(values, {"global": {"nats": {"auth": {"enabled": False}}}}))
    envs = [
        c["env"] for o in plain.of_kind("Deployment") for c in o["spec"]["template"]["spec"]["containers"]
    ]
    assert all({"name": "TESSERA_NATS_URL", "value": "nats://n:4222"} in env for env in envs)
    assert all(e["name"] != "NATS_PASSWORD" for env in envs for e in env)
