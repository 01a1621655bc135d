"""The invariants bench.chaos checks at the end, from three places that must agree: admission's API,
the databases (admission's job history, the scheduler's placements) and the devcluster's pods.

- lost: accepted (the API answered with its id) but unknown to the API or to admission's table;
- duplicated: admitted or placed twice (two `admitted` or `placed` rows in `job_transitions`),
  more placement rows or pods than the job has pods;
- stuck: not in its true state once the soak has settled. A job's true state is what its pods on the
  cluster say (all Succeeded: succeeded; all ended, some Failed: failed); a job whose pods have not
  ended, or whose state in the API differs, is stuck.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import kubernetes

JOB_LABEL = "tessera.io/job-id"
TERMINAL = ("succeeded", "failed", "rejected", "cancelled")


@dataclass
class Findings:
    lost: list[str] = field(default_factory=list)
    duplicated: dict[str, list[str]] = field(default_factory=dict)
    """job id -> what was doubled"""
    stuck: dict[str, str] = field(default_factory=dict)
    """job id -> 'api state / true state'"""
    states: Counter[str] = field(default_factory=Counter)
    poison_unanswered: list[str] = field(default_factory=list)
    poison_ran: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "lost": len(self.lost),
            "duplicated": len(self.duplicated),
            "stuck": len(self.stuck),
            "states": dict(sorted(self.states.items())),
            "examples": {
                "lost": self.lost[:5],
                "duplicated": dict(list(self.duplicated.items())[:5]),
                "stuck": dict(list(self.stuck.items())[:5]),
                "poison_unanswered": self.poison_unanswered[:5],
                "poison_ran": self.poison_ran[:5],
            },
            "poison_unanswered": len(self.poison_unanswered),
            "poison_ran": len(self.poison_ran),
        }


async def db_states(database_url: str, ids: list[str]) -> dict[str, str]:
    """job id -> state in admission's table (missing ids absent)."""
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        rows = await conn.fetch("SELECT id, state FROM admission.jobs WHERE id = ANY($1::text[])", ids)
    finally:
        await conn.close()
    return {r["id"]: r["state"] for r in rows}


async def db_doubles(database_url: str, ids: list[str]) -> dict[str, list[str]]:
    """Jobs admitted or placed twice in admission's history, or with more placement rows in the
    scheduler's table than pods (a soak job has one pod)."""
    doubled: dict[str, list[str]] = {}
    conn = await asyncpg.connect(database_url, timeout=10)
    try:
        for row in await conn.fetch(
            "SELECT job_id, state, count(*) AS n FROM admission.job_transitions "
            "WHERE job_id = ANY($1::text[]) AND state IN ('admitted', 'placed') "
            "GROUP BY job_id, state HAVING count(*) > 1",
            ids,
        ):
            doubled.setdefault(row["job_id"], []).append(f"{row['state']} x{row['n']}")
        for row in await conn.fetch(
            "SELECT job_id, count(*) AS n FROM scheduler.placements WHERE job_id = ANY($1::text[]) "
            "GROUP BY job_id HAVING count(*) > 1",
            ids,
        ):
            doubled.setdefault(row["job_id"], []).append(f"placement rows x{row['n']}")
    finally:
        await conn.close()
    return doubled


def cluster_pods(kubeconfig: Path) -> dict[str, list[str]]:
    """job id -> phases of its pods on the devcluster, through the official client."""
    with kubernetes.config.new_client_from_config(str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
        pods = kubernetes.client.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=JOB_LABEL).items
    found: dict[str, list[str]] = {}
    for pod in pods:
        labels = (pod.metadata.labels if pod.metadata else None) or {}
        phase = (pod.status.phase if pod.status else None) or "Unknown"
        found.setdefault(labels.get(JOB_LABEL, ""), []).append(phase)
    return found


def true_state(phases: list[str], pods_per_job: int) -> str:
    ended = [p for p in phases if p in ("Succeeded", "Failed")]
    if len(ended) < pods_per_job:
        return "running on the cluster" if phases else "no pods"
    return "failed" if "Failed" in ended else "succeeded"


async def api_states(http: httpx.AsyncClient, ids: list[str]) -> dict[str, str]:
    """job id -> state as the API answers it (404 absent; other answers 'HTTP n')."""
    found: dict[str, str] = {}
    gate = asyncio.Semaphore(8)

    async def one(job_id: str) -> None:
        async with gate:
            for _ in range(5):
                try:
                    reply = await http.get(f"/v1/jobs/{job_id}")
                except httpx.HTTPError:
                    await asyncio.sleep(1)
                    continue
                if reply.status_code == 200:
                    found[job_id] = reply.json()["state"]
                elif reply.status_code != 404:
                    found[job_id] = f"HTTP {reply.status_code}"
                return

    await asyncio.gather(*(one(i) for i in ids))
    return found


async def check(
    http: httpx.AsyncClient,
    database_url: str,
    kubeconfig: Path,
    accepted: list[str],
    poisoned: list[str],
    pods_per_job: int = 1,
) -> Findings:
    findings = Findings()
    api = await api_states(http, accepted + poisoned)
    db = await db_states(database_url, accepted + poisoned)
    pods = await asyncio.to_thread(cluster_pods, kubeconfig)
    findings.lost = [i for i in accepted if i not in api or i not in db]
    findings.duplicated = await db_doubles(database_url, accepted + poisoned)
    for job_id, phases in pods.items():
        if len(phases) > pods_per_job and job_id in accepted:
            findings.duplicated.setdefault(job_id, []).append(f"pods x{len(phases)}")
    for job_id in accepted:
        state = api.get(job_id, "absent")
        findings.states[state] += 1
        truth = true_state(pods.get(job_id, []), pods_per_job)
        if state != truth:
            findings.stuck[job_id] = f"{state} / {truth}"
    findings.poison_unanswered = [i for i in poisoned if api.get(i) != "rejected"]
    findings.poison_ran = [i for i in poisoned if i in pods]
    return findings


async def settled(database_url: str, accepted: list[str]) -> tuple[int, Counter[str]]:
    """How many accepted jobs are not yet in an end state (from admission's table), and their states."""
    states = await db_states(database_url, accepted)
    waiting = Counter(states.get(i, "absent") for i in accepted if states.get(i) not in TERMINAL)
    return sum(waiting.values()), waiting
