"""A service that can no longer hear NATS exits so that its supervisor restarts it.

The server (here, a proxy speaking for it) answers with a protocol error, which nats.py treats as
final: the client closes for good and never reconnects. /healthz fails at once, and after
`liveness_exit_after_s` the process exits with code 70 rather than stay deaf while it looks alive."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tessera.core.runner import NOT_LIVE_EXIT_CODE
from tessera.testing.services import ServiceProcess, eventually
from tessera.testing.tcp_proxy import CuttableProxy, cuttable_proxy

pytestmark = pytest.mark.integration


@pytest.fixture
async def proxy(system: tuple[str, str]) -> AsyncIterator[CuttableProxy]:
    async with cuttable_proxy(system[0]) as p:
        yield p


async def test_a_service_whose_connection_closed_for_good_exits_to_be_restarted(
    system: tuple[str, str], proxy: CuttableProxy, tmp_path: Path
) -> None:
    _, db = system
    service = ServiceProcess(
        "checkpoint",
        {
            "TESSERA_NATS_URL": proxy.url(),
            "TESSERA_DATABASE_URL": db,
            "TESSERA_CHECKPOINT_LIVENESS_EXIT_AFTER_S": "2",
        },
        tmp_path,
    )
    service.start()
    try:
        await service.wait_ready()
        assert await proxy.inject(b"-ERR 'Unknown Protocol Operation'\r\n") == 1

        async def failing() -> dict[str, str] | None:
            async with httpx.AsyncClient() as client:
                health = await client.get(f"{service.url}/healthz", timeout=2)
            return health.json()["problems"] if health.status_code == 503 else None

        assert await eventually(failing, timeout=10, what="/healthz failing") == {
            "nats": "connection closed for good"
        }
        assert await service.wait_exit(timeout=30) == NOT_LIVE_EXIT_CODE
        assert "exiting so that the supervisor restarts the service" in service.log_path.read_text()
    finally:
        service.stop()
