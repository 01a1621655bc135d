"""The async engine, built in bootstrap and never at import."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine


def async_url(url: str) -> str:
    """`postgresql://…` as users write it -> the asyncpg dialect SQLAlchemy needs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def sync_url(url: str) -> str:
    """The same database for the sync code paths (Alembic runs async too, so this is for display)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def make_engine(url: str, *, pool_size: int = 10, application_name: str = "tessera") -> AsyncEngine:
    return create_async_engine(
        async_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={"server_settings": {"application_name": application_name}},
    )


def make_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)
