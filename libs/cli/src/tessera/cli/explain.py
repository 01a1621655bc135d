"""`tessera jobs explain`: a job's story, and why it is where it is, from admission's job resource.

Admission records every transition of a job and every decision that did not change its state (a
wait and its reason, the scheduler's "unschedulable" report, a preemption request, a saved
checkpoint) in the job's history; this module reads that history as a story, and names the latest
decision of each side: admission's (waiting and why, admitted where, preempted, rejected) and the
scheduler's (placed where, or unschedulable and why). Pure: it turns the resource into an
:class:`Explanation` (``to_json`` for scripts) and into lines for people.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

#: why a queued job waits (the admission cycle's reasons), and what lets it go on
WAIT_HINTS = {
    "QuotaExhausted": "its queue {queue} has no unused quota and no job it may preempt; it is admitted "
    "when quota is freed (see `tessera queues status {queue}`)",
    "NoMatchingFlavor": "no flavor of queue {queue} covers what it asks for; it waits until the job or the "
    "queue changes",
    "NoFeasiblePlacement": "its quota is there, but the free GPUs cannot hold it as shaped; it is admitted "
    "when room frees up",
    "WaitingForVictims": "preemption was requested for it; it is admitted once the victims give their "
    "quota back or their deadline passes",
    "BlockedByHead": "queue {queue} is strict FIFO and a job ahead of it cannot be admitted yet",
    "Inadmissible": "the current queue configuration cannot take it",
}
UNSCHEDULABLE_HINT = (
    "its quota is granted but the scheduler found no room for the whole gang; it is tried again "
    "when the cluster changes (capacity freed, nodes added, GPU slices changed)"
)
PENDING_HINT = "its quota is granted; the scheduler has not placed it yet"
QUEUED_HINT = "accepted and queued; no admission cycle has considered it yet"

ADMISSION_STATES = ("submitted", "queued", "admitted", "preempted", "cancelled", "rejected")
SCHEDULER_STATES = ("placed", "running", "succeeded", "failed")


@dataclass(frozen=True)
class Step:
    """One entry of the job's history, read: what ``kind`` of thing happened."""

    at: str
    after_s: float
    """Seconds since the job was submitted."""
    state: str
    kind: str
    """The state entered, or ``waiting``, ``unschedulable``, ``preemption_requested``, ``checkpoint``,
    ``note`` for a decision that left the state as it was."""
    reason: str
    code: str | None = None
    """A wait's reason code (``QuotaExhausted``)."""
    message: str | None = None
    """A wait's or an unschedulable report's own words."""


@dataclass(frozen=True)
class Decision:
    decision: str
    reason: str
    at: str | None = None


@dataclass(frozen=True)
class Explanation:
    job: Mapping[str, Any]
    story: list[Step]
    admission: Decision
    scheduler: Decision | None
    waiting: bool
    """Whether the job waits (for quota or for a placement)."""
    hint: str | None
    checkpoint: Mapping[str, Any] | None = None
    errors: list[Mapping[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _parse_at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def read_step(entry: Mapping[str, Any], previous_state: str | None, submitted: datetime) -> Step:
    at, state, reason = str(entry["at"]), str(entry["state"]), str(entry["reason"])
    after = max(0.0, (_parse_at(at) - submitted).total_seconds())
    if reason.startswith("waiting: "):
        code, _, message = reason.removeprefix("waiting: ").partition(": ")
        return Step(at, after, state, "waiting", reason, code, message)
    if reason.startswith("unschedulable: "):
        return Step(at, after, state, "unschedulable", reason, message=reason.removeprefix("unschedulable: "))
    if reason.startswith("preemption requested by "):
        return Step(at, after, state, "preemption_requested", reason)
    if reason.startswith("checkpoint saved"):
        return Step(at, after, state, "checkpoint", reason)
    if state != previous_state:
        return Step(at, after, state, state, reason)
    return Step(at, after, state, "note", reason)


def explain(job: Mapping[str, Any]) -> Explanation:
    """A job resource (``GET /v1/jobs/{id}``) as a story with its latest decisions."""
    history: Sequence[Mapping[str, Any]] = job.get("history") or []
    submitted = _parse_at(str(job["submitted_at"]))
    story: list[Step] = []
    previous: str | None = None
    for entry in history:
        step = read_step(entry, previous, submitted)
        story.append(step)
        previous = step.state
    state, queue = str(job["state"]), str(job.get("queue", ""))
    admission, scheduler, hint = _admission(story, state, queue), _scheduler(story, state), None
    waiting = state in ("queued", "admitted")
    if state == "queued":
        wait = _last(story, "waiting", since="queued")
        hint = WAIT_HINTS.get(wait.code or "", "").format(queue=queue) if wait else QUEUED_HINT
        hint = hint or (wait.message if wait else None)
    elif state == "admitted" and scheduler is not None:
        hint = UNSCHEDULABLE_HINT if scheduler.decision == "unschedulable" else PENDING_HINT
    checkpoints = job.get("checkpoints") or []
    summary = {k: job.get(k) for k in ("id", "name", "tenant", "queue", "priority", "state", "submitted_at")}
    return Explanation(
        summary,
        story,
        admission,
        scheduler,
        waiting,
        hint,
        checkpoints[0] if checkpoints else None,
        [dict(e) for e in job.get("errors") or []],
    )


def _last(story: Sequence[Step], kind: str, since: str | None = None) -> Step | None:
    """The latest step of ``kind``, counting only from the latest entry into state ``since``."""
    start = 0
    if since is not None:
        entries = [i for i, s in enumerate(story) if s.kind == since]
        start = entries[-1] if entries else 0
    found = [s for s in story[start:] if s.kind == kind]
    return found[-1] if found else None


def _admission(story: Sequence[Step], state: str, queue: str) -> Decision:
    if state == "queued":
        wait = _last(story, "waiting", since="queued")
        if wait is None:
            return Decision("queued", f"queued in {queue}, not considered yet")
        return Decision("waiting", f"{wait.code}: {wait.message}", wait.at)
    decided = [s for s in story if s.kind in ADMISSION_STATES[2:] or s.kind == "preemption_requested"]
    if decided:
        last = decided[-1]
        return Decision(last.kind, last.reason, last.at)
    last_step = story[-1] if story else None
    return Decision(state, last_step.reason if last_step else state, last_step.at if last_step else None)


def _scheduler(story: Sequence[Step], state: str) -> Decision | None:
    admitted = [i for i, s in enumerate(story) if s.kind == "admitted"]
    if not admitted:
        return None
    since = story[admitted[-1] :]  # the latest admission: a requeued job starts over
    placed = [s for s in since if s.kind == "placed"]
    if placed:
        return Decision("placed", placed[-1].reason, placed[-1].at)
    report = [s for s in since if s.kind == "unschedulable"]
    if report:
        return Decision("unschedulable", report[-1].message or report[-1].reason, report[-1].at)
    if state == "admitted":
        return Decision("pending", "not placed yet")
    return None


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"+{seconds:.1f}s"
    if seconds < 3600:
        return f"+{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"+{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def render(explanation: Explanation) -> list[str]:
    """The explanation as plain lines (the command prints them with rich's markup escaped)."""
    job = explanation.job
    entries = [step.after_s for step in explanation.story if step.kind == job["state"]]
    entered = entries[-1] if entries else None
    lines = [
        f"{job['name']} ({job['id']})  tenant {job['tenant']}, queue {job['queue']}, priority {job['priority']}",
        f"state: {job['state']}"
        + (f" (since {_age(entered)} after submission)" if entered is not None else ""),
        "",
        "what happened:",
    ]
    width = max((len(step.kind) for step in explanation.story), default=0)
    for step in explanation.story:
        text = f"{step.code}: {step.message}" if step.kind == "waiting" else step.reason
        if step.kind == "unschedulable":
            text = step.message or step.reason
        lines.append(f"  {_age(step.after_s):>9}  {step.kind:<{width}}  {text}")
    lines += [
        "",
        "latest decisions:",
        f"  admission  {explanation.admission.decision}: {explanation.admission.reason}",
    ]
    if explanation.scheduler is not None:
        lines.append(f"  scheduler  {explanation.scheduler.decision}: {explanation.scheduler.reason}")
    for error in explanation.errors:
        lines.append(f"  error      {error.get('field')}: {error.get('reason')}")
    if explanation.checkpoint is not None:
        cp = explanation.checkpoint
        lines.append(f"  checkpoint step {cp.get('step')} at {cp.get('at')} ({cp.get('uri')})")
    if explanation.hint:
        lines += ["", f"why it waits: {explanation.hint}"]
    return lines
