"""A chaos soak of the embedded stack: steady submissions while services, NATS and PostgreSQL are
killed with SIGKILL at random (seeded), poison submissions go over NATS and oversized bodies to the
API; then the invariants.

    python -m bench.chaos --minutes 5 --seed 7 --json bench/results/chaos.json

`tessera up` runs as a subprocess in a temporary state directory (its devcluster at 10x speed).
Jobs of one pod and one GPU that runs 20 simulated seconds are submitted through the REST API at
--rate per second, each under an Idempotency-Key of its own and retried with it until answered
(a 503 or a refused connection during an outage is retried; a job counts as accepted once the API
answers with its id). Faults come one at a time: kill -9 of a service, of NATS or of PostgreSQL, in
a seeded order that gives each kind its turn before any repeats; after each, the soak waits until
every service answers /readyz and a probe job submitted after the kill (at a higher priority, so
that it goes ahead of the backlog) is placed: the recovery time. It then pauses and sends poison. Faults stop --quiet seconds before the end; submissions go on
to the end. The soak then waits until every accepted job has ended, or 60 s after the last fault
or submission, and checks (bench/chaos_checks.py):

- lost: accepted but absent from the API or admission's table;
- duplicated: admitted or placed twice (admission's `job_transitions`, the scheduler's
  `placements`), or more pods on the devcluster than the job has;
- stuck: not in its true state (what its pods on the devcluster say) at that point.

Jobs stuck at that point are watched --drain seconds more, and those still not in their true state
are reported as `stuck_after_drain`: a backlog on a busy machine drains, a wedged job does not.

JSON: {"accepted", "lost", "duplicated", "stuck", "kills": {"service", "nats", "postgres"},
"poison", "max_recovery_s", ...details}. Exit status 0 when lost = duplicated = stuck = 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.client import Client as NATS

from bench import chaos_checks, chaos_poison
from bench.chaos_stack import INFRA, SERVICES, UpStack

FAULT_KINDS = ("service", "nats", "postgres")
SETTLE_S = 60.0
RECOVERY_LIMIT_S = 120.0
PLACED = ("placed", "running", "succeeded", "failed")
PROBE_PRIORITY = 1000


def job_spec(name: str, priority: int = 0) -> dict[str, Any]:
    """One pod, one GPU, 20 simulated seconds; never preempted, so a job admitted twice is a defect."""
    return {
        "name": name,
        "tenant": "chaos",
        "queue": "default",
        "priority": priority,
        "preemptible": False,
        "pod_groups": [
            {
                "name": "w",
                "replicas": 1,
                "cpu": "1",
                "memory": "1Gi",
                "gpu": {"count": 1},
                "template": {
                    "metadata": {"annotations": {"tessera.io/sim-duration": "20s"}},
                    "spec": {
                        "containers": [
                            {"name": "main", "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"}
                        ]
                    },
                },
            }
        ],
    }


class Soak:
    def __init__(self, args: argparse.Namespace, stack: UpStack) -> None:
        self.args = args
        self.stack = stack
        self.rng = random.Random(args.seed)
        self.prefix = f"chaos-{args.seed}"
        self.accepted: dict[str, float] = {}
        self.refused: Counter[str] = Counter()
        self.retried: Counter[str] = Counter()
        """Answers that made a submission try again (503 during an outage; 500 is a defect)."""
        self.unanswered: list[str] = []
        self.kills: Counter[str] = Counter()
        self.faults: list[dict[str, Any]] = []
        self.poison: list[chaos_poison.Injected] = []
        self.started = time.monotonic()
        self.last_fault = self.started
        self.in_flight = 0
        assert stack.endpoints is not None and stack.endpoints.admission_api_url
        self.http = httpx.AsyncClient(base_url=stack.endpoints.admission_api_url, timeout=10)

    def t(self) -> float:
        return time.monotonic() - self.started

    def say(self, line: str) -> None:
        print(f"[{self.t():6.1f}s] {line}", flush=True)

    # -- submissions ----------------------------------------------------------------------------------
    async def submit(self, job_id: str, give_up_after: float = 180.0, priority: int = 0) -> bool:
        """POST the job under its key until the API answers with its id."""
        self.in_flight += 1
        deadline = time.monotonic() + give_up_after
        try:
            while time.monotonic() < deadline:
                try:
                    reply = await self.http.post(
                        "/v1/jobs", json=job_spec(job_id, priority), headers={"Idempotency-Key": job_id}
                    )
                except httpx.HTTPError:
                    await asyncio.sleep(1)
                    continue
                if reply.status_code in (200, 201):
                    self.accepted.setdefault(reply.json()["id"], time.monotonic())
                    return True
                if reply.status_code >= 500 or reply.status_code == 429:
                    # an outage: retried under the same key; a 500 (rather than 503) is counted
                    self.retried[f"HTTP {reply.status_code}"] += 1
                    await asyncio.sleep(1)
                    continue
                self.refused[f"HTTP {reply.status_code}"] += 1
                self.say(f"submission {job_id} refused: HTTP {reply.status_code} {reply.text[:200]}")
                return False
            self.unanswered.append(job_id)
            return False
        finally:
            self.in_flight -= 1

    async def submitter(self, until: float) -> None:
        tasks: set[asyncio.Task[bool]] = set()
        n = 0
        while time.monotonic() < until:
            n += 1
            task = asyncio.create_task(self.submit(f"{self.prefix}-{n}"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(1 / self.args.rate)
        if tasks:
            await asyncio.gather(*tasks)

    async def state_of(self, job_id: str) -> str | None:
        try:
            reply = await self.http.get(f"/v1/jobs/{job_id}")
        except httpx.HTTPError:
            return None
        return str(reply.json()["state"]) if reply.status_code == 200 else None

    # -- faults ---------------------------------------------------------------------------------------
    def fault_order(self) -> list[str]:
        """Each kind once in a shuffled round, then again: every kind gets its turn before repeats."""
        order: list[str] = []
        while len(order) < 60:
            round_ = list(FAULT_KINDS)
            self.rng.shuffle(round_)
            order += round_
        return order

    async def all_ready(self) -> bool:
        assert self.stack.endpoints is not None
        for endpoint in self.stack.endpoints.services.values():
            try:
                if (await self.http.get(endpoint.ready_url, timeout=3)).status_code != 200:
                    return False
            except httpx.HTTPError:
                return False
        return True

    async def fault(self, kind: str, number: int) -> None:
        name = self.rng.choice(SERVICES) if kind == "service" else kind
        offset = len(self.stack.output())
        for _ in range(40):  # the process may be between a crash and its restart
            if self.stack.process(kind, name) is not None:
                break
            await asyncio.sleep(0.5)
        pid = self.stack.kill(kind, name)
        killed_at = time.monotonic()
        self.last_fault = killed_at
        self.kills[kind] += 1
        self.say(f"fault #{number}: kill -9 {name} (pid {pid})")
        await asyncio.sleep(0.5)
        probe = f"{self.prefix}-probe-{number}"
        # ahead of the backlog (a higher priority), so that it measures the stack, not the queue
        probe_task = asyncio.create_task(
            self.submit(probe, give_up_after=RECOVERY_LIMIT_S, priority=PROBE_PRIORITY)
        )
        ready_at: float | None = None
        placed_at: float | None = None
        restarted = kind == "service"
        while time.monotonic() - killed_at < RECOVERY_LIMIT_S:
            if not restarted:
                restarted = self.stack.said_since(
                    offset, rf"{kind} +\| restarted \(pid \d+\) and ready again"
                )
            if ready_at is None and restarted and await self.all_ready():
                ready_at = time.monotonic()
            if placed_at is None and probe_task.done() and (await self.state_of(probe)) in PLACED:
                placed_at = time.monotonic()
            if ready_at is not None and placed_at is not None:
                break
            await asyncio.sleep(0.25)
        recovered = None if ready_at is None or placed_at is None else max(ready_at, placed_at) - killed_at
        self.faults.append(
            {
                "at_s": round(killed_at - self.started, 1),
                "kind": kind,
                "process": name,
                "recovery_s": None if recovered is None else round(recovered, 2),
                "ready_s": None if ready_at is None else round(ready_at - killed_at, 2),
            }
        )
        self.say(
            f"fault #{number}: {name} recovered in {recovered:.1f}s"
            if recovered is not None
            else f"fault #{number}: {name} NOT recovered within {RECOVERY_LIMIT_S:.0f}s"
        )
        if not probe_task.done():
            await probe_task

    async def send_poison(self, nc: NATS, number: int) -> None:
        kind = self.rng.choice(chaos_poison.KINDS)
        injected = await chaos_poison.inject(kind, f"{self.prefix}-poison-{number}", nc, self.http)
        self.poison.append(injected)
        if not injected.ok:
            self.say(f"poison #{number} ({kind}) not as meant: {injected.detail}")

    async def chaos(self, until: float, nc: NATS) -> None:
        order = self.fault_order()
        await asyncio.sleep(self.args.warmup)
        number = poisons = 0
        while time.monotonic() < until:
            number += 1
            await self.fault(order[number - 1], number)
            pause_until = time.monotonic() + self.rng.uniform(self.args.pause / 2, self.args.pause * 1.5)
            while time.monotonic() < min(pause_until, until):
                poisons += 1
                await self.send_poison(nc, poisons)
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))

    async def progress(self) -> None:
        while True:
            await asyncio.sleep(10)
            kills = "/".join(str(self.kills[k]) for k in FAULT_KINDS)
            self.say(
                f"accepted {len(self.accepted)}, in flight {self.in_flight}, kills service/nats/postgres "
                f"{kills}, poison {len(self.poison)}"
            )

    # -- the run --------------------------------------------------------------------------------------
    async def run(self) -> dict[str, Any]:
        endpoints = self.stack.endpoints
        assert endpoints is not None and endpoints.kubeconfig

        async def quiet(*_: object) -> None:  # NATS killed on purpose: no tracebacks on the console
            return None

        nc = await nats.connect(
            endpoints.nats_url,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=quiet,
            disconnected_cb=quiet,
            reconnected_cb=quiet,
        )
        progress = asyncio.create_task(self.progress())
        end = self.started + self.args.minutes * 60
        try:
            await asyncio.gather(self.submitter(end), self.chaos(end - self.args.quiet, nc))
            last_submit = max(self.accepted.values(), default=end)
            deadline = max(self.last_fault, last_submit) + SETTLE_S
            accepted = sorted(self.accepted)
            self.say(
                f"submissions over; waiting until every job ends (at most {deadline - time.monotonic():.0f}s)"
            )
            waiting = await self.wait_until_ended(endpoints.database_url, accepted, deadline)
            poisoned = [p.job_id for p in self.poison if p.job_id is not None and p.ok]
            findings = await chaos_checks.check(
                self.http, endpoints.database_url, Path(endpoints.kubeconfig), accepted, poisoned
            )
            later: chaos_checks.Findings | None = None
            if findings.stuck and self.args.drain > 0:
                # stuck at the deadline: slow (a backlog on a busy machine) or wedged for good?
                self.say(
                    f"{len(findings.stuck)} stuck; watching {self.args.drain:.0f}s more to tell slow from wedged"
                )
                await self.wait_until_ended(
                    endpoints.database_url, accepted, time.monotonic() + self.args.drain
                )
                later = await chaos_checks.check(
                    self.http, endpoints.database_url, Path(endpoints.kubeconfig), accepted, poisoned
                )
        finally:
            progress.cancel()
            await nc.close()
            await self.http.aclose()
        result = self.result(findings)
        result["settle_waiting"] = waiting
        if later is not None:
            result["stuck_after_drain"] = len(later.stuck)
            result["after_drain"] = later.summary()
        return result

    async def wait_until_ended(self, database_url: str, accepted: list[str], deadline: float) -> int:
        """Until every accepted job has ended or the deadline: how many had not."""
        while True:
            try:
                waiting, states = await chaos_checks.settled(database_url, accepted)
            except (TimeoutError, OSError) as exc:
                waiting, states = -1, Counter({type(exc).__name__: 1})
            if waiting == 0 or time.monotonic() >= deadline:
                self.say(f"{waiting} not ended {dict(states)}")
                return waiting
            await asyncio.sleep(2)

    def result(self, findings: chaos_checks.Findings) -> dict[str, Any]:
        recoveries = [f["recovery_s"] for f in self.faults]
        summary = findings.summary()
        return {
            "accepted": len(self.accepted),
            "lost": summary["lost"],
            "duplicated": summary["duplicated"],
            "stuck": summary["stuck"],
            "kills": {k: self.kills[k] for k in FAULT_KINDS},
            "poison": len(self.poison),
            "max_recovery_s": (
                None if not recoveries or None in recoveries else max(r for r in recoveries if r is not None)
            ),
            "unrecovered_faults": sum(1 for r in recoveries if r is None),
            "poison_by_kind": dict(Counter(p.kind for p in self.poison)),
            "poison_not_as_meant": [f"{p.kind}: {p.detail}" for p in self.poison if not p.ok][:10],
            "poison_unanswered": summary["poison_unanswered"],
            "poison_ran": summary["poison_ran"],
            "refused": dict(self.refused),
            "retried_answers": dict(self.retried),
            "unanswered_submissions": len(self.unanswered),
            "final_states": summary["states"],
            "examples": summary["examples"],
            "faults": self.faults,
            "config": {
                "minutes": self.args.minutes,
                "seed": self.args.seed,
                "rate": self.args.rate,
                "warmup_s": self.args.warmup,
                "quiet_s": self.args.quiet,
                "pause_s": self.args.pause,
                "settle_s": SETTLE_S,
                "drain_s": self.args.drain,
                "devcluster_speed": self.args.speed,
                "fault_kinds": {"service": list(SERVICES), **{k: [v] for k, v in INFRA.items()}},
            },
        }


def passed(result: dict[str, Any]) -> bool:
    return bool(result["lost"] == result["duplicated"] == result["stuck"] == 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the soak (default: 5)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the faults' order, targets and pauses")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--rate", type=float, default=1.0, help="job submissions per second (default: 1)")
    parser.add_argument(
        "--warmup", type=float, default=15.0, help="seconds before the first fault (default: 15)"
    )
    parser.add_argument(
        "--quiet", type=float, default=20.0, help="no fault starts in the last QUIET seconds (default: 20)"
    )
    parser.add_argument("--pause", type=float, default=4.0, help="mean pause between faults, s (default: 4)")
    parser.add_argument("--speed", type=float, default=10.0, help="devcluster speed (default: 10)")
    parser.add_argument(
        "--drain",
        type=float,
        default=180.0,
        help="when jobs are stuck at the deadline, watch this many seconds more and report how many "
        "still are (stuck_after_drain): slow or wedged (default: 180; 0: no)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the state directory and up.log")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("minutes", "rate", "speed"):
        if getattr(args, name) <= 0:
            parser.print_usage(sys.stderr)
            print(f"--{name} must be positive", file=sys.stderr)
            return 2
    root = Path(tempfile.mkdtemp(prefix="tessera-chaos-"))
    root.chmod(0o755)  # PostgreSQL's own user reaches its data directory below
    stack = UpStack(root / "state", devcluster_speed=args.speed)
    print(f"starting tessera up in {stack.state} (log {stack.log_path})", flush=True)
    try:
        stack.start()
        result = asyncio.run(Soak(args, stack).run())
    finally:
        code = stack.stop()
        print(f"tessera up stopped (exit code {code})", flush=True)
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    result["tessera_up_exit_code"] = code
    print(json.dumps({k: result[k] for k in list(result)[:8]}, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if passed(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
