"""Changes to the queueing configuration: checked whole by the domain before they are saved."""

from __future__ import annotations

import logging
from collections.abc import Callable

from tessera.admission.domain.documents import StoredConfig
from tessera.admission.domain.queueing import QueueingConfig, QueueingValidationError
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.core.observability.ratelimit import RateLimitedLog

log = logging.getLogger(__name__)
skipped_log = RateLimitedLog(log, interval_s=300.0)


async def change_config(
    uow: AdmissionUnitOfWork, change: Callable[[StoredConfig], StoredConfig]
) -> StoredConfig:
    """Save `change(current)` once it checks out; raises `QueueingValidationError` naming the
    field otherwise. The next cycle decides on the new configuration. The caller commits.

    A stored entry the configuration is built without (`StoredConfig.skipped`) does not stop a change
    to the rest; a change that writes such an entry (adds or alters one) is refused."""
    await uow.gate.hold_off()
    before = await uow.config.load()
    after = change(before)
    had = before.skipped()
    for entry in after.skipped():
        if entry not in had:
            raise QueueingValidationError(entry.field, entry.reason)
    after.usable().build()
    await uow.config.save(before, after)
    await uow.gate.mark_changed()
    return after


def usable_config(stored: StoredConfig) -> QueueingConfig:
    """What admission decides on: the stored configuration without its skipped entries, each logged
    as an error (at most once per five minutes per entry) with how to fix it. Raises
    `QueueingValidationError` when the rest does not check out."""
    for entry in stored.skipped():
        skipped_log.log(
            logging.ERROR,
            entry.field,
            f"stored configuration entry {entry.field} skipped: {entry.reason}; {entry.fix}",
            extra={"field": entry.field, "entry": entry.entry},
        )
    return stored.usable().build()
