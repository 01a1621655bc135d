"""Who may publish and subscribe to what on NATS: the table each user's permissions are made from.

:data:`TRAFFIC` says, per service, the durable consumers it reads (name, stream owner, filter) and
the commands it sends into other services' streams; everything else a service publishes lies in its
own stream (`tessera.<service>.>`: its events, its dead letters, its own commands). Tests check the
table against each service's consumer specs and against the messages its source constructs, the way
the chart's RBAC is checked against the Kubernetes calls the code makes.

From it each service's user gets the least that its work needs on JetStream: its stream's info,
create and update; per consumer the consumer's info, create, next-message requests and acks; replies
on its own inbox prefix only (:func:`inbox_prefix`), so no user reads another's replies. A tenant may
publish only its submit subject (:func:`tessera.contracts.subjects.tenant_submit_job`); the
devcluster's simulated trainers may report checkpoints and follow their save commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tessera.contracts import subjects

JS_API = "$JS.API"
ADMIN_USER = "tessera-admin"
DEVCLUSTER_USER = "tessera-devcluster"


@dataclass(frozen=True, order=True)
class Consumption:
    """A durable pull consumer: its name, the service whose stream it reads, its filter subject."""

    name: str
    stream_owner: str
    filter_subject: str

    @property
    def stream(self) -> str:
        return subjects.stream_name(self.stream_owner)


@dataclass(frozen=True)
class Traffic:
    consumes: tuple[Consumption, ...] = ()
    sends: tuple[str, ...] = ()
    """Subjects in other services' streams that this service publishes (commands)."""


def _c(name: str, owner: str, subject: str) -> Consumption:
    return Consumption(name, owner, subject)


#: per service, what it reads and what it sends beyond its own stream
TRAFFIC: Mapping[str, Traffic] = {
    "admission": Traffic(
        consumes=(
            _c("admission-submit", "admission", subjects.SUBMIT_JOB),
            _c("admission-tenant-submit", "admission", subjects.ALL_TENANT_SUBMITS),
            _c("admission-outcomes", "admission", subjects.REPORT_JOB_OUTCOME),
            _c("admission-scheduler-outcomes", "scheduler", "tessera.scheduler.evt.>"),
            _c("admission-inventory", "telemetry", subjects.INVENTORY_CHANGED),
            _c("admission-checkpoints", "checkpoint", subjects.CHECKPOINT_SAVED),
        )
    ),
    "scheduler": Traffic(
        consumes=(
            _c("scheduler-admitted", "admission", subjects.JOB_ADMITTED),
            _c("scheduler-inventory", "telemetry", subjects.INVENTORY_CHANGED),
            _c("scheduler-gpu-health", "telemetry", subjects.GPU_UNHEALTHY),
            _c("scheduler-preemption", "admission", subjects.PREEMPTION_REQUESTED),
            _c("scheduler-job-finished", "admission", subjects.JOB_FINISHED),
            _c("scheduler-ready-for-eviction", "checkpoint", subjects.READY_FOR_EVICTION),
        ),
        sends=(subjects.REPORT_JOB_OUTCOME,),
    ),
    "telemetry": Traffic(
        consumes=(
            _c("telemetry-jobs-accepted", "admission", subjects.JOB_ACCEPTED),
            _c("telemetry-jobs-admitted", "admission", subjects.JOB_ADMITTED),
            _c("telemetry-placements", "scheduler", subjects.GANG_PLACED),
            _c("telemetry-gangs-finished", "scheduler", subjects.GANG_FINISHED),
            _c("telemetry-pods-evicted", "scheduler", subjects.PODS_EVICTED),
        )
    ),
    "forecaster": Traffic(
        consumes=(
            _c("forecaster-gpu-samples", "telemetry", subjects.ALL_GPU_SAMPLES),
            _c("forecaster-inventory", "telemetry", subjects.INVENTORY_CHANGED),
            _c("forecaster-metrics", "forecaster", subjects.RECORD_METRIC),
        )
    ),
    "slicing": Traffic(
        consumes=(
            _c("slicing-scheduler-events", "scheduler", "tessera.scheduler.evt.>"),
            _c("slicing-inventory", "telemetry", subjects.INVENTORY_CHANGED),
            _c("slicing-gpu-idle", "telemetry", subjects.GPU_IDLE),
            _c("slicing-pod-usage", "telemetry", subjects.ALL_POD_GPU_USAGE),
            _c("slicing-forecasts", "forecaster", subjects.FORECAST_UPDATED),
            _c("slicing-ready-for-eviction", "checkpoint", subjects.READY_FOR_EVICTION),
        )
    ),
    "checkpoint": Traffic(
        consumes=(
            _c("checkpoint-reports", "checkpoint", subjects.REPORT_CHECKPOINT),
            _c("checkpoint-preemptions", "admission", subjects.PREEMPTION_REQUESTED),
            _c("checkpoint-admitted", "admission", subjects.JOB_ADMITTED),
            _c("checkpoint-jobs-finished", "admission", subjects.JOB_FINISHED),
            _c("checkpoint-placements", "scheduler", subjects.GANG_PLACED),
            _c("checkpoint-gangs-finished", "scheduler", subjects.GANG_FINISHED),
        )
    ),
}


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def to_config(self) -> dict[str, object]:
        """The `permissions` block of a user in nats-server's configuration."""
        return {"publish": {"allow": list(self.publish)}, "subscribe": {"allow": list(self.subscribe)}}


def service_user(service: str) -> str:
    return f"tessera-{service}"


def tenant_user(tenant: str) -> str:
    return f"tenant-{tenant}"


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix a user's client must use (nats.py: ``connect(inbox_prefix=...)``).
    Its first token is the user's own, so no other user's allowance (``_INBOX.>`` included) covers it."""
    return f"_INBOX_{user}"


def consumer_subjects(consumer: Consumption) -> list[str]:
    """What reading one durable pull consumer takes: look up its stream (the runner tells a stream
    created anew by its creation time) and the consumer, create it, pull from it, ack. The create
    request names the filter in its subject (nats.py does so for a named consumer; the server
    refuses a config whose filter differs), so a user cannot widen its consumer to other subjects.
    A stream's info is its configuration and counters, no message."""
    stream, name = consumer.stream, consumer.name
    return [
        f"{JS_API}.STREAM.INFO.{stream}",
        f"{JS_API}.CONSUMER.INFO.{stream}.{name}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.{name}.{consumer.filter_subject}",
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{name}",
        f"$JS.ACK.{stream}.{name}.>",
    ]


def service_permissions(service: str) -> Permissions:
    traffic = TRAFFIC[service]
    stream = subjects.stream_name(service)
    publish = [
        subjects.stream_subjects(service),
        *traffic.sends,
        *(f"{JS_API}.STREAM.{verb}.{stream}" for verb in ("INFO", "CREATE", "UPDATE")),
    ]
    for consumer in traffic.consumes:
        publish += consumer_subjects(consumer)
    return Permissions(tuple(publish), (f"{inbox_prefix(service_user(service))}.>",))


def tenant_permissions(tenant: str) -> Permissions:
    """A tenant's publisher: its submit subject, and the replies (PubAcks) on its own inbox prefix."""
    return Permissions((subjects.tenant_submit_job(tenant),), (f"{inbox_prefix(tenant_user(tenant))}.>",))


def devcluster_permissions() -> Permissions:
    """The devcluster's simulated trainers (the checkpoint client library): report checkpoints, and
    follow their save commands with an ordered consumer on the checkpoint stream (found by subject,
    created and re-created, its flow control answered); replies on the default inbox prefix."""
    stream = subjects.stream_name("checkpoint")
    return Permissions(
        (
            subjects.REPORT_CHECKPOINT,
            f"{JS_API}.STREAM.NAMES",
            f"{JS_API}.CONSUMER.CREATE.{stream}",
            f"{JS_API}.CONSUMER.CREATE.{stream}.>",
            f"{JS_API}.CONSUMER.DELETE.{stream}.>",
            f"$JS.FC.{stream}.>",
        ),
        ("_INBOX.>",),
    )
