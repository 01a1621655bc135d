"""The shared runtime: messaging, database, observability, settings and the service runner."""
