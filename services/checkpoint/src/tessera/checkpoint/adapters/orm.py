"""Tables of the checkpoint schema."""

from __future__ import annotations

from sqlalchemy import MetaData

from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.recording.repository import observed_events_table

metadata = MetaData(schema="checkpoint")
outbox, inbox = add_messaging_tables(metadata)
observed_events = observed_events_table(metadata)
