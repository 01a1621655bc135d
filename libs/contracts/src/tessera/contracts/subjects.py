"""Subject names: the one place they are spelled."""

from __future__ import annotations

import re

ROOT = "tessera"
SERVICES = ("telemetry", "forecaster", "admission", "scheduler", "slicing", "checkpoint")
_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


def stream_name(service: str) -> str:
    return f"TESSERA_{service.upper()}"


def stream_subjects(service: str) -> str:
    return f"{ROOT}.{service}.>"


def event(owner: str, name: str) -> str:
    return f"{ROOT}.{owner}.evt.{name}"


def command(receiver: str, verb: str) -> str:
    return f"{ROOT}.{receiver}.cmd.{verb}"


def dead_letter(service: str, consumer: str) -> str:
    return f"{ROOT}.{service}.dlq.{consumer}"


def save_checkpoint(job_id: str) -> str:
    """The save command for one job's training process; job ids may hold dots, which a token may not.

    The subject has one token more than `tessera.checkpoint.cmd.<verb>`, so the checkpoint service's own
    consumer of its commands (`tessera.checkpoint.cmd.*`) never sees the commands it sends to trainers.
    """
    return f"{ROOT}.checkpoint.cmd.save.{_TOKEN.sub('_', job_id)}"


def tenant_submit_job(tenant: str) -> str:
    """The submit subject of one tenant: external publishers hold credentials for theirs alone, and
    admission refuses a submission whose spec names another tenant. Tenants are DNS labels (no dots)."""
    return f"{SUBMIT_JOB}.{tenant}"


def gpu_samples(node: str) -> str:
    """Samples of one node; node names may hold dots, which are not allowed inside a token."""
    return f"{ROOT}.telemetry.gpu.{_TOKEN.sub('_', node)}"


def pod_gpu_usage(node: str) -> str:
    """Per-pod GPU use of one node (one batch per sampling round); node names may hold dots."""
    return f"{ROOT}.telemetry.pod_usage.{_TOKEN.sub('_', node)}"


SUBMIT_JOB = command("admission", "submit_job")
ALL_TENANT_SUBMITS = f"{SUBMIT_JOB}.*"
JOB_ACCEPTED = event("admission", "job_accepted")
JOB_REJECTED = event("admission", "job_rejected")
JOB_ADMITTED = event("admission", "job_admitted")
GANG_PLACED = event("scheduler", "gang_placed")
GANG_UNSCHEDULABLE = event("scheduler", "gang_unschedulable")
GANG_FINISHED = event("scheduler", "gang_finished")
PODS_EVICTED = event("scheduler", "pods_evicted")
DEMAND_CHANGED = event("scheduler", "demand_changed")
INVENTORY_CHANGED = event("telemetry", "inventory_changed")
ALL_GPU_SAMPLES = f"{ROOT}.telemetry.gpu.*"
ALL_POD_GPU_USAGE = f"{ROOT}.telemetry.pod_usage.*"
GPU_UNHEALTHY = event("telemetry", "gpu_unhealthy")
GPU_IDLE = event("telemetry", "gpu_idle")
RIGHTSIZING_RECOMMENDED = event("telemetry", "rightsizing_recommended")
PREEMPTION_REQUESTED = event("admission", "preemption_requested")
JOB_STATE_CHANGED = event("admission", "job_state_changed")
JOB_FINISHED = event("admission", "job_finished")
REPORT_JOB_OUTCOME = command("admission", "report_job_outcome")
ALL_SAVE_CHECKPOINT = f"{ROOT}.checkpoint.cmd.save.*"
REPORT_CHECKPOINT = command("checkpoint", "report_checkpoint")
CHECKPOINT_SAVED = event("checkpoint", "checkpoint_saved")
CHECKPOINT_FAILED = event("checkpoint", "checkpoint_failed")
READY_FOR_EVICTION = event("checkpoint", "ready_for_eviction")
RECORD_METRIC = command("forecaster", "record_metric")
FORECAST_UPDATED = event("forecaster", "forecast_updated")
LAYOUT_PLANNED = event("slicing", "layout_planned")
RECONFIGURED = event("slicing", "reconfigured")
RECONFIG_FAILED = event("slicing", "reconfig_failed")
