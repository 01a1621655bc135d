"""Changes to the queueing configuration: checked whole by the domain before they are saved."""

from __future__ import annotations

from collections.abc import Callable

from tessera.admission.domain.documents import StoredConfig
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork


async def change_config(
    uow: AdmissionUnitOfWork, change: Callable[[StoredConfig], StoredConfig]
) -> StoredConfig:
    """Save `change(current)` once it checks out; raises `QueueingValidationError` naming the
    field otherwise. The next cycle decides on the new configuration. The caller commits."""
    await uow.gate.hold_off()
    before = await uow.config.load()
    after = change(before)
    after.build()
    await uow.config.save(before, after)
    await uow.gate.mark_changed()
    return after
