"""Store what the monitor observed, and publish the findings people and services act on.

Rollups, findings and the events that announce them are written in one transaction (the outbox),
so a finding is published exactly when it is stored.
"""

from __future__ import annotations

from tessera.contracts.events import GpuIdle, GpuUnhealthy
from tessera.telemetry.domain.health import BecameUnhealthy, HealthChange
from tessera.telemetry.domain.idle import BecameIdle, IdleChange
from tessera.telemetry.domain.model import FindingKind, GpuFinding
from tessera.telemetry.domain.monitor import Monitor, Observation
from tessera.telemetry.service_layer.unit_of_work import TelemetryUnitOfWork


async def record_observation(uow: TelemetryUnitOfWork, observation: Observation) -> None:
    await uow.rollups.save(observation.rollups)
    for health in observation.health:
        await _record_health(uow, health)
    for idle in observation.idle:
        await _record_idle(uow, idle)


async def _record_health(uow: TelemetryUnitOfWork, change: HealthChange) -> None:
    r = change.reading
    if not isinstance(change, BecameUnhealthy):
        await uow.findings.end(FindingKind.UNHEALTHY, r.gpu_uuid, r.at)
        await uow.inventory.set_gpu_health(r.gpu_uuid, True, r.at)
        return
    finding = change.finding
    event = GpuUnhealthy(
        node=r.node,
        gpu_index=r.gpu_index,
        gpu_uuid=r.gpu_uuid,
        faults=[f.value for f in finding.faults],
        reasons=list(finding.faults.values()),
        at=r.at,
        xid=finding.xid,
    )
    await uow.findings.open(
        GpuFinding(
            FindingKind.UNHEALTHY, r.gpu_uuid, r.node, r.gpu_index, r.at, event.model_dump(mode="json")
        )
    )
    await uow.inventory.set_gpu_health(r.gpu_uuid, False, r.at)
    await uow.publish(event)


async def _record_idle(uow: TelemetryUnitOfWork, change: IdleChange) -> None:
    if not isinstance(change, BecameIdle):
        await uow.findings.end(FindingKind.IDLE, change.gpu_uuid, change.at)
        return
    r = change.reading
    event = GpuIdle(
        node=r.node,
        gpu_index=r.gpu_index,
        gpu_uuid=r.gpu_uuid,
        pods=list(r.pods or ()),
        idle_since=change.idle_since,
        at=r.at,
        mean_utilization_pct=change.mean_utilization_pct,
        memory_used_mib=r.memory_used_mib,
    )
    detail = event.model_dump(mode="json")
    await uow.findings.open(
        GpuFinding(FindingKind.IDLE, r.gpu_uuid, r.node, r.gpu_index, change.idle_since, detail)
    )
    await uow.publish(event)


async def restore_findings(uow: TelemetryUnitOfWork, monitor: Monitor) -> int:
    """Seed the monitor with the findings still open, so a restart does not report them again."""
    findings = await uow.findings.open_findings()
    for finding in findings:
        if finding.kind is FindingKind.UNHEALTHY:
            monitor.health.seed_unhealthy(finding.gpu_uuid)
        else:
            monitor.idle.seed_idle(finding.gpu_uuid, finding.pods, finding.since)
    return len(findings)
