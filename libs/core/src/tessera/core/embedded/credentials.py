"""Passwords an embedded stack makes for itself, kept under its state directory for its owner alone."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write ``path`` atomically, readable and writable by its owner alone (0600, in a 0700 directory
    when it has to be made)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class PasswordFile:
    """Name -> password in one JSON file (0600); a password is made the first time it is asked for
    and the same one is given after a restart."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def known(self) -> dict[str, str]:
        try:
            raw = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def password(self, name: str) -> str:
        known = self.known()
        if name not in known:
            known[name] = secrets.token_urlsafe(24)
            write_private(self.path, json.dumps(known, indent=2, sort_keys=True) + "\n")
        return known[name]
