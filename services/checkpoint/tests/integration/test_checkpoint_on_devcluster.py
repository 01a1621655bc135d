"""Spot and node loss on a 4x8 A100 devcluster, watched through the real `kubernetes` client, with real
NATS and Postgres: a termination taint on a node asks each checkpointable job on it to save, once, even
across a restart; the devcluster's spot interruption notice carries the deadline the request gets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tessera.checkpoint import bootstrap
from tessera.checkpoint.domain.signals import parse_time
from tessera.cluster.kube import api_client
from tessera.contracts import subjects
from tessera.contracts.events import GangPlaced, JobAdmitted, PodPlacement
from tessera.devcluster.runner import DevCluster
from tessera.testing.builders import a_job
from tessera.testing.services import eventually, running

pytestmark = pytest.mark.integration

CLUSTER_FILE = Path(__file__).resolve().parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
SPOT_TAINT = "aws-node-termination-handler/spot-itn"
NOTICE_S = 20.0


@pytest.fixture
def devcluster() -> Iterator[DevCluster]:
    with DevCluster.from_file(CLUSTER_FILE, speed=1.0) as cluster:
        yield cluster


def taint(kubeconfig: Path, node: str, key: str, value: str) -> None:
    """As the AWS Node Termination Handler does: through the API server, with the official client."""
    from kubernetes import client

    api = api_client(kubeconfig=str(kubeconfig))
    try:
        body = {"spec": {"taints": [{"key": key, "value": value, "effect": "NoSchedule"}]}}
        client.CoreV1Api(api).patch_node(node, body)
    finally:
        api.close()


async def run_on(stack: Any, job_id: str, node: str, *, checkpointable: bool) -> None:
    """Admission admits the job and the scheduler places its one pod on `node`."""
    spec = a_job("train").with_(checkpointable=checkpointable).build()
    await stack.publish(
        JobAdmitted(job_id=job_id, spec=spec, submitted_at=datetime.now(UTC)),
        GangPlaced(job_id=job_id, placements=[PodPlacement(pod=f"{job_id}-0", group="workers", node=node)]),
    )


async def placed(stack: Any, *job_ids: str) -> None:
    async def known() -> bool:
        rows = await stack.rows("SELECT DISTINCT job_id FROM checkpoint.job_pods")
        return {row[0] for row in rows} >= set(job_ids)

    await eventually(known, what=f"the placements of {', '.join(job_ids)}")


async def saves(stack: Any, job_id: str) -> list[Any]:
    return [e for e in await stack.events(subjects.save_checkpoint(job_id)) if e.job_id == job_id]


async def test_a_tainted_node_asks_its_checkpointable_jobs_once_even_across_a_restart(
    stack: Any, devcluster: DevCluster, tmp_path: Path, trainers: Any
) -> None:
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")
    settings = stack.settings(kubeconfig=kubeconfig, spot={"notice_s": NOTICE_S})
    doomed, stateless, elsewhere, later = (
        f"{name}-{uuid.uuid4().hex[:6]}" for name in ("doomed", "stateless", "elsewhere", "later")
    )
    async with running(bootstrap.build(settings), settings):
        await run_on(stack, doomed, "gpu-node-1", checkpointable=True)
        await run_on(stack, stateless, "gpu-node-1", checkpointable=False)
        await run_on(stack, elsewhere, "gpu-node-2", checkpointable=True)
        await placed(stack, doomed, stateless, elsewhere)
        await trainers(doomed)

        tainted_at = datetime.now(UTC)
        await asyncio.to_thread(taint, kubeconfig, "gpu-node-1", SPOT_TAINT, "evt-0001")
        [command] = await eventually(lambda: saves(stack, doomed), what="the save command")
        assert command.reason == "spot_interruption"
        notice = command.deadline - tainted_at
        assert timedelta(seconds=NOTICE_S) <= notice < timedelta(seconds=NOTICE_S + 5)
        ready = await eventually(
            lambda: _of(stack, subjects.READY_FOR_EVICTION, doomed), what="the checkpoint saved in time"
        )
        assert [(r.reason, r.cause, r.preemptor_job_id) for r in ready] == [
            ("checkpoint_saved", "spot_interruption", None)
        ]
        assert ready[0].checkpoint_uri and ready[0].checkpoint_uri.startswith("file://")

    async with running(bootstrap.build(settings), settings):
        # The restart relists every node and finds the same taint: nothing new. A later signal on another
        # node proves the relisted nodes were handled first.
        await run_on(stack, later, "gpu-node-3", checkpointable=True)
        await placed(stack, later)
        await asyncio.to_thread(taint, kubeconfig, "gpu-node-3", "karpenter.sh/disrupted", "")
        [drained] = await eventually(lambda: saves(stack, later), what="the later node's save command")
        assert drained.reason == "node_termination"

    assert len(await saves(stack, doomed)) == 1, "one signal, one request, across the restart"
    assert await saves(stack, stateless) == [], "a job that cannot checkpoint is not asked"
    assert await saves(stack, elsewhere) == [], "nor one on a node that stays"
    signals = await stack.rows("SELECT node, key, value FROM checkpoint.node_signals ORDER BY node")
    assert signals == [
        ("gpu-node-1", f"taint:{SPOT_TAINT}", "evt-0001"),
        ("gpu-node-3", "taint:karpenter.sh/disrupted", ""),
    ]


async def test_the_devclusters_spot_notice_gives_the_request_its_deadline(
    stack: Any, devcluster: DevCluster, tmp_path: Path
) -> None:
    kubeconfig = devcluster.write_kubeconfig(tmp_path / "kubeconfig")
    settings = stack.settings(kubeconfig=kubeconfig)
    job = f"spot-{uuid.uuid4().hex[:6]}"
    async with running(bootstrap.build(settings), settings):
        await run_on(stack, job, "gpu-node-0", checkpointable=True)
        await placed(stack, job)
        notice = devcluster.interrupt_spot("gpu-node-0", notice_s=3)
        [command] = await eventually(lambda: saves(stack, job), what="the save command")
        assert command.deadline == parse_time(notice.terminates_at), (
            "the node's own deadline, not the default"
        )
        # Nobody answers: the job is let go at the node's deadline; then the node is deleted.
        ready = await eventually(
            lambda: _of(stack, subjects.READY_FOR_EVICTION, job), timeout=15, what="the timeout"
        )
        assert [(r.reason, r.cause) for r in ready] == [("checkpoint_timeout", "spot_interruption")]

        async def forgotten() -> bool:
            return await stack.rows("SELECT node FROM checkpoint.node_signals") == []

        await eventually(forgotten, what="the deleted node's signal forgotten", timeout=15)


async def _of(stack: Any, subject: str, job_id: str) -> list[Any]:
    return [e for e in await stack.events(subject) if e.job_id == job_id]
