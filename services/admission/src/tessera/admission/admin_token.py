"""The admin token of a stack started by `tessera up`: made at its first start, kept hashed in the
database like every token, and in clear in a file that only its owner may read (mode 0600), which
the CLI reads when TESSERA_TOKEN is not set. A later start keeps the token while the database still
accepts it, and makes a new one when it does not (a new database, a revoked token)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from sqlalchemy.ext.asyncio import async_sessionmaker

from tessera.admission.adapters import orm
from tessera.admission.service_layer.tokens import TokenRefused, grant_of, issue_admin_token
from tessera.admission.service_layer.unit_of_work import AdmissionUnitOfWork
from tessera.core.db.engine import make_engine

ADMIN_TOKEN_FILE = "admin-token"
"""Its name in the state directory."""


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path`` readable by its owner alone (0600), replacing it whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret + "\n")
    os.chmod(partial, 0o600)
    os.replace(partial, path)


def read_secret(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


async def _ensure(database_url: str, path: Path) -> str | None:
    engine = make_engine(database_url, pool_size=1, application_name="tessera-up")
    try:
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        uow = AdmissionUnitOfWork(sessions, orm.outbox, orm.inbox, "admission")
        async with uow:
            kept = read_secret(path)
            if kept is not None:
                try:
                    if (await grant_of(uow, kept)).admin:
                        return None
                except TokenRefused:
                    pass
            token, _ = await issue_admin_token(uow)
            write_secret(path, token)  # before the commit: a token on file the database lacks is replaced
            await uow.commit()
        return token
    finally:
        await engine.dispose()


def ensure_admin_token(database_url: str, path: Path) -> str | None:
    """Make sure ``path`` holds an admin token the database at ``database_url`` accepts (admission's
    schema migrated). Returns the token when it was made now (to be shown once), else None."""
    return asyncio.run(_ensure(database_url, path))
