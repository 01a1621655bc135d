"""The state directory of an embedded stack (``.tessera`` by default) and what it remembers.

Layout::

    .tessera/
      nats/            JetStream file store
      pg/              PostgreSQL data directory
      devcluster/      the devcluster's objects and simulated hardware (state.json)
      logs/            one log file per component
      credentials/     NATS users and PostgreSQL roles with their passwords, nats.conf, one file
                       per tenant for its external publishers (all 0600)
      ports.json       the ports chosen last time, reused when still free
      endpoints.json   where everything runs (written by ``tessera up``)
      up.lock          held while a ``tessera up`` runs on this directory
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tessera.core.embedded.ports import pick_port


class StateDirBusy(RuntimeError):
    """Another process already runs a stack on this state directory."""


@dataclass(frozen=True)
class StateDir:
    root: Path

    @property
    def nats_store(self) -> Path:
        return self.root / "nats"

    @property
    def pg_data(self) -> Path:
        return self.root / "pg"

    @property
    def devcluster_state(self) -> Path:
        """The devcluster's objects and simulated hardware, restored when ``tessera up`` starts again."""
        return self.root / "devcluster" / "state.json"

    @property
    def credentials(self) -> Path:
        """Passwords and the files holding them, readable by the owner alone."""
        return self.root / "credentials"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log_file(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    @property
    def ports_file(self) -> Path:
        return self.root / "ports.json"

    @property
    def endpoints_file(self) -> Path:
        return self.root / "endpoints.json"

    @property
    def lock_file(self) -> Path:
        return self.root / "up.lock"

    # -- remembered ports ---------------------------------------------------------------------------
    def remembered_ports(self) -> dict[str, int]:
        try:
            raw = json.loads(self.ports_file.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}

    def remember_ports(self, ports: dict[str, int]) -> None:
        merged = self.remembered_ports() | ports
        write_json_atomically(self.ports_file, merged)

    def choose_port(self, name: str, default: int | None) -> int:
        """The port used last time when free, else ``default`` when free, else any free port."""
        return pick_port([self.remembered_ports().get(name), default])

    # -- exclusive use ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold ``up.lock`` for the duration; raise ``StateDirBusy`` when someone else holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        handle: IO[str] = self.lock_file.open("a+")
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise StateDirBusy(
                    f"state directory {self.root} is in use by pid {holder}: stop that 'tessera up' first "
                    "or pass another --state-dir"
                ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(str(os.getpid()))
            handle.flush()
            yield
        finally:
            handle.close()


def write_json_atomically(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
