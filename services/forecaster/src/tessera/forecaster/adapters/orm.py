"""Tables of the forecaster schema."""

from __future__ import annotations

from sqlalchemy import MetaData

from tessera.core.db.messaging_tables import add_messaging_tables
from tessera.core.recording.repository import observed_events_table

metadata = MetaData(schema="forecaster")
outbox, inbox = add_messaging_tables(metadata)
observed_events = observed_events_table(metadata)
