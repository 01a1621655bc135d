"""What admission's handlers, routes and cycle share, built once in `bootstrap.py`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pydantic import SecretStr

from tessera.admission.config import AdmissionSettings, AuthMode
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.core.runner import ServiceContext


@dataclass
class AdmissionDeps:
    ctx: ServiceContext
    auth: AuthMode
    admin_token: SecretStr | None
    cycle_interval_s: float
    full_cycle_interval_s: float
    #: set by a submission or a release in this process, so the cycle runs at once
    cycle_wake: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def from_settings(cls, ctx: ServiceContext, settings: AdmissionSettings) -> AdmissionDeps:
        return cls(
            ctx=ctx,
            auth=settings.auth,
            admin_token=settings.admin_token,
            cycle_interval_s=settings.cycle_interval_s,
            full_cycle_interval_s=settings.full_cycle_interval_s,
        )

    def uow(self) -> AdmissionUnitOfWork:
        uow: AdmissionUnitOfWork = self.ctx.uow()
        return uow

    def wake_cycle(self) -> None:
        self.cycle_wake.set()
