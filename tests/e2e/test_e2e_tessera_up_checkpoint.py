"""Checkpoint first under `tessera up`: a preempted training job saves before it is evicted and, admitted
again, resumes from that checkpoint; a spot interruption gets a checkpoint saved before the node goes.

The jobs run the devcluster's simulated trainer (the real checkpoint client) because admission
annotates a checkpointable job's pod template so. The preemption test configures queues for a while and removes
them again (back to open mode) and cancels its jobs; the spot test deletes a node, so it runs last
(`e2e_last`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import yaml

from tessera.cluster.conventions import CHECKPOINT_URI_ENV, JOB_ID_LABEL, SIM_CHECKPOINT_INTERVAL_ANNOTATION
from tessera.contracts import subjects
from tessera.testing.services import eventually, read_stream
from tests.e2e.harness import Stack, until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TENANT = "ckpt-e2e"
LAST_CHECKPOINT_STEP = "tessera.io/last-checkpoint-step"
RESTORED_STEP = "tessera.io/sim-restored-step"
SIM_STEP = "tessera.io/sim-step"
# One queue with quota for one 1-GPU job. A checkpointable victim gets 60 s (wall clock) to save before
# the scheduler evicts it anyway.
QUEUES: dict[str, Any] = {
    "flavors": [{"name": "a100-80gb", "gpu_model": "A100-80GB"}],
    "queues": [
        {
            "name": TENANT,
            "quotas": [{"flavor": "a100-80gb", "resources": {"gpu": 1}}],
            "preemption": {"within_queue": "lower-priority"},
        }
    ],
    "tenant_queues": [{"tenant": TENANT, "queue": TENANT}],
    "preemption_timing": {"checkpoint_grace_s": 60, "default_grace_s": 10, "release_timeout_s": 30},
}


def training(name: str, priority: int, duration_s: int, checkpoint_every: str) -> dict[str, Any]:
    """A 1-GPU checkpointable job; its trainer checkpoints every `checkpoint_every` simulated seconds
    (or only when asked: "never"), through the job label the scheduler turns into a pod annotation."""
    return {
        "name": name,
        "tenant": TENANT,
        "priority": priority,
        "checkpointable": True,
        "estimated_duration_s": duration_s,
        "labels": {SIM_CHECKPOINT_INTERVAL_ANNOTATION: checkpoint_every},
        "pod_groups": [
            {
                "name": "trainer",
                "replicas": 1,
                "cpu": "1",
                "memory": "1Gi",
                "gpu": {"count": 1},
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "trainer", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
                        ]
                    }
                },
            }
        ],
    }


@pytest.fixture
def admission(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.env["TESSERA_ADMISSION_URL"], timeout=10) as client:
        yield client


def submit(stack: Stack, tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    submitted = stack.tessera("jobs", "submit", str(path))
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def job(admission: httpx.Client, job_id: str) -> dict[str, Any]:
    found: dict[str, Any] = admission.get(f"/v1/jobs/{job_id}").raise_for_status().json()
    return found


def states(admission: httpx.Client, job_id: str) -> list[str]:
    return [step["state"] for step in job(admission, job_id)["history"]]


def pod_of(stack: Stack, job_id: str) -> dict[str, Any] | None:
    """The job's (one) pod as it is now, or None while it has none."""
    pods = json.loads(stack.kubectl("get", "pods", "-l", f"{JOB_ID_LABEL}={job_id}", "-o", "json"))["items"]
    return pods[0] if pods else None


def annotations(pod: dict[str, Any] | None) -> dict[str, str]:
    return dict((pod or {}).get("metadata", {}).get("annotations") or {})


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v.get("value", "") for c in pod["spec"]["containers"] for v in c.get("env") or []}


def test_a_preempted_job_checkpoints_first_and_resumes_from_that_checkpoint(
    stack: Stack, admission: httpx.Client, tmp_path: Path
) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(yaml.safe_dump(QUEUES))
    applied = stack.tessera("queues", "apply", str(queues))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    low = high = ""
    try:
        # The low-priority job fills the queue and its trainer saves a periodic checkpoint (every 30
        # simulated seconds: 3 s here).
        low = submit(stack, tmp_path, training("ckpt-low", 0, 36_000, "30"))
        until(lambda: job(admission, low)["state"] in ("placed", "running"), "the low job placed", 60)
        first = until(
            lambda: (
                (pod := pod_of(stack, low)) is not None and LAST_CHECKPOINT_STEP in annotations(pod) and pod
            ),
            "the low job's trainer to save a periodic checkpoint",
            60,
        )
        until(lambda: job(admission, low)["checkpoints"], "admission to learn the low job's checkpoint", 30)

        # The high-priority job preempts it: the checkpoint service asks it to save, then it is evicted.
        high = submit(stack, tmp_path, training("ckpt-high", 100, 60, "never"))

        def requeued() -> bool:
            seen = states(admission, low)
            return "preempted" in seen and "queued" in seen[seen.index("preempted") :]

        until(requeued, "the low job preempted and queued again", 120)
        history = job(admission, low)["history"]
        released = [h["state"] for h in history].index("preempted")
        saved_before = [
            h["reason"] for h in history[:released] if h["reason"].startswith("checkpoint saved at step")
        ]
        assert "checkpoint" in history[released]["reason"], history[released]
        assert saved_before, [h["reason"] for h in history]
        assert history[released + 1]["reason"] == "requeued after preemption"
        shown = stack.tessera("jobs", "get", low, "--json")
        assert shown.returncode == 0, shown.stderr
        checkpoints = json.loads(shown.stdout)["checkpoints"]
        assert checkpoints and all(isinstance(c["step"], int) and c["uri"] for c in checkpoints), checkpoints
        assert stack.tessera("jobs", "get", low).returncode == 0  # the table view lists them too

        # The high job ends; the low one is admitted again and its new pod resumes from the checkpoint.
        until(lambda: job(admission, high)["state"] == "succeeded", "the high job to end", 120)
        until(lambda: states(admission, low).count("admitted") >= 2, "the low job admitted again", 60)
        old_uid = first["metadata"]["uid"]
        pod = until(
            lambda: (
                (p := pod_of(stack, low)) is not None
                and p["metadata"]["uid"] != old_uid
                and RESTORED_STEP in annotations(p)
                and p
            ),
            "the low job's new pod to restore its checkpoint",
            60,
        )
        # The Job's pod template cannot change once made, so the new pod reads no URI from its env:
        # its trainer (the checkpoint client) resumes from the job's newest checkpoint, the one
        # admission named when it admitted the job again.
        assert CHECKPOINT_URI_ENV not in env_of(pod)
        readmitted = [h for h in job(admission, low)["history"] if h["state"] == "admitted"][-1]
        named = re.search(r"resumes from the checkpoint at step (\d+) \((\S+)\)$", readmitted["reason"])
        assert named is not None, readmitted["reason"]
        assert int(annotations(pod)[RESTORED_STEP]) == int(named[1]) > 0
        assert named[2] in [c["uri"] for c in job(admission, low)["checkpoints"]]
    finally:
        for job_id in (low, high):
            if job_id and job(admission, job_id)["state"] not in ("succeeded", "failed", "cancelled"):
                admission.post(f"/v1/jobs/{job_id}/cancel")
        # Back to open mode, as the other tests (and a fresh `tessera up`) expect.
        for path in (f"tenant-queues/{TENANT}", f"queues/{TENANT}", "flavors/a100-80gb"):
            admission.delete(f"/v1/{path}")
        assert admission.get("/v1/config").json()["queues"] == []


@pytest.mark.e2e_last
async def test_a_spot_interruption_gets_a_checkpoint_saved_before_the_node_goes(
    stack: Stack, admission: httpx.Client, tmp_path: Path
) -> None:
    spot = submit(stack, tmp_path, training("ckpt-spot", 0, 36_000, "never"))  # saves only when asked
    pod = until(
        lambda: (p := pod_of(stack, spot)) is not None and SIM_STEP in annotations(p) and p,
        "the spot job's trainer to run",
        60,
    )
    node = pod["spec"]["nodeName"]
    faulted = stack.tessera(
        "devcluster",
        "fault",
        node,
        "spot-interruption",
        "--notice",
        "20s",
        "--kubeconfig",
        str(stack.kubeconfig),
    )
    assert faulted.returncode == 0, faulted.stdout + faulted.stderr
    goes_at = datetime.fromisoformat(json.loads(faulted.stdout)["injected"]["terminates_at"])
    nc = await nats.connect(stack.nats_url)
    try:
        js = nc.jetstream()

        async def let_go() -> list[dict[str, Any]]:
            found = [e.data for e in await read_stream(js, subjects.READY_FOR_EVICTION, idle_s=0.3)]
            return [e for e in found if e["job_id"] == spot and e.get("cause") == "spot_interruption"]

        (ready,) = await eventually(let_go, timeout=60, what="the checkpoint service to let the spot job go")
        assert ready["reason"] == "checkpoint_saved", ready

        async def saved() -> list[dict[str, Any]]:
            found = [e.data for e in await read_stream(js, subjects.CHECKPOINT_SAVED, idle_s=0.3)]
            return [e for e in found if e["job_id"] == spot and e["request_id"] == ready["request_id"]]

        (checkpoint,) = await eventually(saved, timeout=30, what="the spot job's requested checkpoint_saved")
    finally:
        await nc.close()
    assert datetime.fromisoformat(checkpoint["at"]) < goes_at, (checkpoint, goes_at)
    assert checkpoint["uri"] == ready["checkpoint_uri"] and checkpoint["step"] == ready["step"]
    told = f"checkpoint saved at step {checkpoint['step']} ({checkpoint['uri']})"
    until(
        lambda: told in [h["reason"] for h in job(admission, spot)["history"]],
        "admission to tell the spot job's checkpoint in its history",
        30,
    )
