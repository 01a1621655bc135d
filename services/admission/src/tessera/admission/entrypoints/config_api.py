"""REST over the queueing configuration: flavors, cohorts, queues, tenant queues and priority
classes (list, get, create, update, delete), a whole document at once (`PUT /v1/config`, what
`tessera queues apply` sends), and queue status. Writes are for the admin token; every write is
checked whole by the domain (negative quota, cohort cycles, unknown flavors...). A tenant's token
reads only its own queue's configuration and status. Tokens are in `tokens_api`."""

# No `from __future__ import annotations`: the route factory's body types must be real objects.

import dataclasses
from collections.abc import Callable
from enum import Enum
from typing import Any

from fastapi import APIRouter, Request, status
from pydantic import BaseModel

from tessera.admission.domain.documents import (
    CohortDoc,
    FlavorDoc,
    PriorityClassDoc,
    QueueDoc,
    QueueingDocument,
    StoredConfig,
    TenantQueueDoc,
)
from tessera.admission.domain.queueing import QueueingValidationError
from tessera.admission.entrypoints.auth import Caller, Principal, deps_of
from tessera.admission.entrypoints.errors import ERRORS, ApiError, not_found
from tessera.admission.entrypoints.queue_status import QueueStatus, queue_status
from tessera.admission.service_layer.configuration import change_config

router = APIRouter(prefix="/v1", responses=ERRORS)


async def _write(request: Request, change: Callable[[StoredConfig], StoredConfig]) -> StoredConfig:
    deps = deps_of(request)
    async with deps.uow() as uow:
        try:
            after = await change_config(uow, change)
        except QueueingValidationError as exc:
            raise ApiError(422, "invalid_config", f"{exc.field}: {exc.reason}", exc.field) from None
        await uow.commit()
    deps.wake_cycle()
    return after


async def _read(request: Request, caller: Principal) -> StoredConfig:
    """The configuration as ``caller`` may see it: all of it for the admin; for a tenant, its own
    queue (what its tenant queue names), the cohorts above it, its tenant queue, and the flavors and
    priority classes every job may name."""
    async with deps_of(request).uow() as uow:
        cfg = await uow.config.load()
    return cfg if caller.admin else seen_by(cfg, caller.tenant)


def seen_by(cfg: StoredConfig, tenant: str | None) -> StoredConfig:
    mine = [tq for tq in cfg.tenant_queues if tq.tenant == tenant]
    queues = [q for q in cfg.queues if q.name in {tq.queue for tq in mine}]
    parents = {c.name: c.parent for c in cfg.cohorts}
    above: set[str] = set()
    for queue in queues:
        cohort = queue.cohort
        while cohort is not None and cohort not in above:
            above.add(cohort)
            cohort = parents.get(cohort)
    return dataclasses.replace(
        cfg, cohorts=[c for c in cfg.cohorts if c.name in above], queues=queues, tenant_queues=mine
    )


def _crud(path: str, model: type[BaseModel], key: str, attr: str, what: str) -> None:
    tag: list[str | Enum] = [path]

    def items(cfg: StoredConfig) -> list[Any]:
        return list(getattr(cfg, attr))

    def replace(cfg: StoredConfig, values: list[Any]) -> StoredConfig:
        data = dict(cfg.__dict__)
        data[attr] = values
        return StoredConfig(**data)

    @router.get(f"/{path}", tags=tag, response_model=list[model], summary=f"List {what}s")  # type: ignore[valid-type]
    async def list_items(request: Request, caller: Caller) -> Any:
        return items(await _read(request, caller))

    @router.get(f"/{path}/{{name}}", tags=tag, response_model=model, summary=f"Get a {what}")
    async def get_item(request: Request, caller: Caller, name: str) -> Any:
        for item in items(await _read(request, caller)):
            if getattr(item, key) == name:
                return item
        raise not_found(what, name)

    @router.post(
        f"/{path}",
        tags=tag,
        response_model=model,
        status_code=status.HTTP_201_CREATED,
        summary=f"Create a {what}",
    )
    async def create_item(request: Request, caller: Caller, body: model) -> Any:  # type: ignore[valid-type]
        caller.require_admin(f"create a {what}")
        name = getattr(body, key)

        def change(cfg: StoredConfig) -> StoredConfig:
            if any(getattr(i, key) == name for i in items(cfg)):
                raise ApiError(409, "conflict", f"a {what} named {name!r} exists; PUT to update it", key)
            return replace(cfg, [*items(cfg), body])

        await _write(request, change)
        return body

    @router.put(f"/{path}/{{name}}", tags=tag, response_model=model, summary=f"Create or update a {what}")
    async def update_item(request: Request, caller: Caller, name: str, body: model) -> Any:  # type: ignore[valid-type]
        caller.require_admin(f"update a {what}")
        if getattr(body, key) != name:
            raise ApiError(422, "invalid", f"the body's {key} must be {name!r}", key)

        def change(cfg: StoredConfig) -> StoredConfig:
            return replace(cfg, [i for i in items(cfg) if getattr(i, key) != name] + [body])

        await _write(request, change)
        return body

    @router.delete(
        f"/{path}/{{name}}", tags=tag, status_code=status.HTTP_204_NO_CONTENT, summary=f"Delete a {what}"
    )
    async def delete_item(request: Request, caller: Caller, name: str) -> None:
        caller.require_admin(f"delete a {what}")

        def change(cfg: StoredConfig) -> StoredConfig:
            kept = [i for i in items(cfg) if getattr(i, key) != name]
            if len(kept) == len(items(cfg)):
                raise not_found(what, name)
            return replace(cfg, kept)

        await _write(request, change)


_crud("flavors", FlavorDoc, "name", "flavors", "flavor")
_crud("cohorts", CohortDoc, "name", "cohorts", "cohort")
_crud("queues", QueueDoc, "name", "queues", "queue")
_crud("tenant-queues", TenantQueueDoc, "tenant", "tenant_queues", "tenant queue")
_crud("priority-classes", PriorityClassDoc, "name", "priority_classes", "priority class")


class Applied(BaseModel):
    flavors: int
    cohorts: int
    queues: int
    tenant_queues: int
    priority_classes: int


@router.put("/config", tags=["config"], response_model=Applied)
async def apply_config(request: Request, caller: Caller, body: QueueingDocument) -> Applied:
    """Apply a document: entries are created or replaced by name; others are left as they are."""
    caller.require_admin("apply a configuration")
    after = await _write(request, lambda cfg: cfg.merged(body))
    return Applied(
        flavors=len(after.flavors),
        cohorts=len(after.cohorts),
        queues=len(after.queues),
        tenant_queues=len(after.tenant_queues),
        priority_classes=len(after.priority_classes),
    )


@router.get("/config", tags=["config"], response_model=QueueingDocument)
async def get_config(request: Request, caller: Caller) -> QueueingDocument:
    """The whole configuration (admin); a tenant's token sees its own queue and what it needs."""
    cfg = await _read(request, caller)
    return QueueingDocument(
        flavors=cfg.flavors,
        cohorts=cfg.cohorts,
        queues=cfg.queues,
        tenant_queues=cfg.tenant_queues,
        priority_classes=cfg.priority_classes,
        fair_sharing=cfg.fair_sharing,
        preemption_timing=cfg.timing,
    )


class SkippedEntryView(BaseModel):
    field: str
    reason: str
    fix: str
    entry: dict[str, Any]


class ConfigStatus(BaseModel):
    skipped: list[SkippedEntryView]
    """Stored entries admission decides without (a rule made since they were stored refuses them),
    each with why and how to fix it; the rest of the configuration is in force."""


@router.get("/config/status", tags=["config"], response_model=ConfigStatus)
async def get_config_status(request: Request, caller: Caller) -> ConfigStatus:
    """Whether the stored configuration is in force whole (admin): the entries it is built without."""
    caller.require_admin("read the configuration's status")
    async with deps_of(request).uow() as uow:
        stored = await uow.config.load()
    return ConfigStatus(skipped=[SkippedEntryView(**dataclasses.asdict(e)) for e in stored.skipped()])


@router.get("/queues/{name}/status", tags=["queues"], response_model=QueueStatus)
async def get_queue_status(request: Request, caller: Caller, name: str) -> QueueStatus:
    """Usage, borrowed and lent quota per flavor and resource, pending and admitted jobs. A tenant's
    token sees only its own queue's (another is answered as unknown), and of a queue several tenants
    share, only its own jobs' ids."""
    if not caller.admin and not [q for q in (await _read(request, caller)).queues if q.name == name]:
        raise not_found("queue", name)
    async with deps_of(request).uow() as uow:
        found = await queue_status(uow, name, tenant=None if caller.admin else caller.tenant)
    if found is None:
        raise not_found("queue", name)
    return found
