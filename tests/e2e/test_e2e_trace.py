"""One job's whole story is one trace: submitted, waiting for quota, admitted, placed, bound.

The services of the session's `tessera up` export their spans to the test's OTLP collector. The job
waits in a queue of one GPU behind another job; once that one is cancelled, it is admitted and
placed, and a node made full beforehand (or filled by earlier tests) is among those the scheduler's
filters turned away.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tessera.cluster.conventions.names import GPU_ASSIGNMENT_ANNOTATION
from tessera.cluster.conventions.nodes import parse_node
from tessera.cluster.conventions.pods import parse_pod
from tessera.testing.otlp import CollectedSpan
from tests.e2e.harness import Stack, until

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TENANT = QUEUE = "e2e-trace"
FLAVOR = "e2e-a100"
CONFIG = {
    "flavors": [{"name": FLAVOR, "gpu_model": "A100-80GB"}],
    "queues": [{"name": QUEUE, "quotas": [{"flavor": FLAVOR, "resources": {"gpu": 1}}]}],
    "tenant_queues": [{"tenant": TENANT, "queue": QUEUE}],
}
BLOCKER = "e2e-trace-blocker"
DECISIONS = {"admission.submit_job", "admission.wait", "admission.admit", "scheduler.place_gang"}


def job_file(tmp_path: Path, name: str, duration_s: int) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"name: {name}\ntenant: {TENANT}\nestimated_duration_s: {duration_s}\n"
        "pod_groups:\n  - {name: worker, replicas: 1, cpu: '2', memory: 8Gi, gpu: {count: 1},\n"
        "     template: {spec: {containers: [{name: main, image: 'pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime'}]}}}\n"
    )
    return path


@pytest.fixture
def one_gpu_queue(stack: Stack) -> Iterator[httpx.Client]:
    """A queue of one GPU for the test's tenant; the stack goes back to open mode afterwards."""
    with httpx.Client(base_url=stack.env["TESSERA_ADMISSION_URL"], timeout=15) as api:
        assert api.put("/v1/config", json=CONFIG).status_code == 200
        try:
            yield api
        finally:
            api.delete(f"/v1/tenant-queues/{TENANT}")
            api.delete(f"/v1/queues/{QUEUE}")
            api.delete(f"/v1/flavors/{FLAVOR}")


def free_gpus(stack: Stack) -> dict[str, tuple[list[str], int]]:
    """Per node: the UUIDs of the whole GPUs free in the scheduler's books (no pod's assignment
    names them) and how many the device plugin can still hand out (allocatable less the limits)."""
    nodes = {
        n.name: n for n in map(parse_node, json.loads(stack.kubectl("get", "nodes", "-o", "json"))["items"])
    }
    by_limits = {name: node.extended_allocatable.get("nvidia.com/gpu", 0) for name, node in nodes.items()}
    named: dict[str, set[str]] = {name: set() for name in nodes}
    for raw in json.loads(stack.kubectl("get", "pods", "-A", "-o", "json"))["items"]:
        pod = parse_pod(raw)
        if pod.node_name not in nodes or raw["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        for container in raw["spec"]["containers"]:
            limits = (container.get("resources") or {}).get("limits") or {}
            by_limits[pod.node_name] -= int(limits.get("nvidia.com/gpu", "0"))
        if pod.assignment is not None:
            named[pod.node_name] |= {share.gpu_uuid for share in pod.assignment.shares}
    return {
        name: (
            [g.uuid for g in node.gpus if g.uuid not in named[name] and not g.mig_instances],
            by_limits[name],
        )
        for name, node in nodes.items()
    }


@pytest.fixture
def a_full_node(stack: Stack) -> Iterator[str]:
    """A node whose free GPUs a pod of another scheduler takes (its assignment annotation names
    them, so the scheduler counts them): the filters must reject it. The node with the most GPUs
    free in both the scheduler's books and the device plugin's keeps room for the test's jobs."""
    free = free_gpus(stack)
    room = {name: min(len(uuids), count) for name, (uuids, count) in free.items()}
    keep = max(room, key=lambda name: (room[name], name))
    assert room[keep] > 0, f"the test needs a node with a free GPU: {free}"
    # where the two agree, no GPU is unhealthy or held unannotated (the kubelet refuses to admit an
    # assignment naming an unhealthy GPU)
    others = sorted(n for n, (uuids, count) in free.items() if uuids and len(uuids) == count and n != keep)
    if not others:  # every other node is full, or hard to tell: the filters turn some away already
        yield ""
        return
    node = others[0]
    uuids, count = free[node]
    assignment = {"v": 1, "node": node, "gpus": [{"uuid": uuid, "milli": 1000} for uuid in uuids]}
    limits = {"nvidia.com/gpu": str(min(len(uuids), count))} if count > 0 else {}
    blocker = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": BLOCKER,
            "namespace": "default",
            "annotations": {GPU_ASSIGNMENT_ANNOTATION: json.dumps(assignment)},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "main",
                    "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
                    "resources": {"limits": limits},
                }
            ],
        },
    }
    stack.kubectl("apply", "-f", "-", stdin=json.dumps(blocker))
    until(
        lambda: stack.kubectl("get", "pod", BLOCKER, "-o", "jsonpath={.status.phase}") == "Running",
        "the blocking pod to run",
    )
    try:
        yield node
    finally:
        stack.kubectl("delete", "pod", BLOCKER, "--wait=false")


def submit(stack: Stack, path: Path) -> str:
    submitted = stack.tessera("jobs", "submit", str(path))
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def state_of(stack: Stack, job_id: str) -> str:
    shown = stack.tessera("jobs", "get", job_id, "--json")
    found: str = json.loads(shown.stdout)["state"]
    return found


def test_a_job_that_waits_for_quota_is_one_trace_from_submission_to_its_binds(
    stack: Stack, one_gpu_queue: httpx.Client, a_full_node: str, tmp_path: Path
) -> None:
    holder = submit(stack, job_file(tmp_path, "holds-the-quota", duration_s=3600))
    until(lambda: state_of(stack, holder) in ("placed", "running"), "the first job to hold the quota")
    job = submit(stack, job_file(tmp_path, "waits-for-quota", duration_s=20))
    until(lambda: "waiting" in stack.tessera("jobs", "explain", job).stdout, "the second job to wait")
    cancelled = stack.tessera("jobs", "cancel", holder)  # its quota is free for the next cycle
    assert cancelled.returncode == 0, cancelled.stderr
    until(lambda: state_of(stack, job) in ("running", "succeeded"), "the second job to run", timeout=90)
    traces = stack.traces

    # -- one trace, from the submission on ---------------------------------------------------------
    [submitted] = traces.wait_for_span("admission.submit_job", job_id=job)
    trace_id = submitted.trace_id

    def story(collector: Any) -> list[CollectedSpan]:
        spans = collector.trace(trace_id)
        names = {s.name for s in spans}
        wanted = {"admission.wait", "admission.admit", "scheduler.place_gang", "scheduler.bind"}
        return spans if wanted <= names else []

    try:
        spans = traces.wait_for(story, what=f"the admission and scheduler spans of {job}")
    except AssertionError as error:
        found = sorted((s.name, s.trace_id == trace_id) for s in traces.spans(job_id=job))
        told = stack.tessera("jobs", "explain", job).stdout
        raise AssertionError(f"{error}\nspans of the job (name, in its trace): {found}\n{told}") from None
    of_job = [s for s in spans if s.attributes.get("job_id") == job]
    decided = [s for s in traces.spans(job_id=job) if s.name in DECISIONS]
    assert {s.trace_id for s in decided} == {trace_id}, "a decision about the job is in another trace"
    assert {s.service for s in of_job} >= {"tessera-admission", "tessera-scheduler"}

    # -- every admission cycle that decided something about it --------------------------------------
    waits = [s for s in of_job if s.name == "admission.wait"]
    assert waits and all(s.has(queue=QUEUE, decision="waiting", reason="QuotaExhausted") for s in waits)
    assert waits[0].attributes["message"]
    [admitted] = [s for s in of_job if s.name == "admission.admit"]
    assert admitted.has(queue=QUEUE, flavor=FLAVOR, decision="admitted", borrowing=False)
    assert admitted.attributes["reason"] == f"admitted to queue {QUEUE} in flavor {FLAVOR}"
    assert waits[0].start_ns < admitted.start_ns
    for span in [*waits, admitted]:  # each links the span of the cycle that took it
        [(cycle_trace, cycle_span)] = span.links
        traces.wait_for(
            lambda c, t=cycle_trace, i=cycle_span: [
                x for x in c.spans("admission.cycle", trace_id=t) if x.span_id == i
            ],
            what="the linked admission cycle",
        )

    # -- the scheduler's decision: nodes, score, and the nodes its filters rejected ------------------
    placed = [s for s in of_job if s.name == "scheduler.place_gang" and s.attributes["outcome"] == "placed"]
    assert len(placed) == 1, [s.attributes for s in of_job if s.name == "scheduler.place_gang"]
    decision = placed[0]
    node = decision.attributes["nodes"]
    assert node.startswith("gpu-node-") and node != a_full_node
    assert decision.attributes["pods"] == 1
    assert isinstance(decision.attributes["score"], int)
    assert decision.attributes["nodes.considered"] >= 2
    assert decision.attributes["nodes.rejected"] >= 1
    assert "insufficient GPU on" in decision.attributes["rejected"], decision.attributes
    assert submitted in traces.ancestors(decision), "the decision descends from the submission"

    # -- each bind, a child of the decision -----------------------------------------------------------
    binds = [s for s in spans if s.name == "scheduler.bind"]
    assert [b.parent_span_id for b in binds] == [decision.span_id]
    assert binds[0].has(node=node, gpus=binds[0].attributes["gpus"]) and binds[0].status != "error"
    assert "waits-for-quota" in binds[0].attributes["pod"]

    # -- and the CLI tells the same story ----------------------------------------------------------
    explained = stack.tessera("jobs", "explain", job, "--json")
    assert explained.returncode == 0, explained.stderr
    story_json = json.loads(explained.stdout)
    kinds = [step["kind"] for step in story_json["story"]]
    assert "waiting" in kinds and kinds.index("waiting") < kinds.index("admitted")
    assert state_of(stack, holder) == "cancelled"
