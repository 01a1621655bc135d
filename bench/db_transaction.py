"""What one short transaction costs the process, by the layer it goes through.

    python -m bench.db_transaction --json bench/results/db_transaction.json

A producer of the bus commits each event in a transaction of its own (`bench.bus`'s one event per
commit), and the services run their units of work through SQLAlchemy's `AsyncSession`. This times
the same transaction (BEGIN, `SELECT 1`, COMMIT) three ways, one after another, repeated
(`--repeat`) so a trend in the machine's load favours none: through an ORM session (as a unit of
work), through a Core connection, and on a bare asyncpg connection. The figures are this process's
user and system CPU per transaction (`resource.getrusage`) and the wall time, medians of the
repetitions; the server is the same for all three (embedded unless `--database-url` is given)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import text

from tessera.core.db.engine import make_engine, make_session_factory

SELECT_1 = text("SELECT 1")


def _usage() -> tuple[float, float]:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime, used.ru_stime


async def _time(body: Callable[[], Awaitable[None]], transactions: int) -> dict[str, float]:
    for _ in range(50):  # warm: the pool's connection, the prepared statement
        await body()
    user, system = _usage()
    started = time.perf_counter()
    for _ in range(transactions):
        await body()
    wall = time.perf_counter() - started
    user_after, system_after = _usage()
    return {
        "user_us": (user_after - user) / transactions * 1e6,
        "system_us": (system_after - system) / transactions * 1e6,
        "wall_us": wall / transactions * 1e6,
    }


async def run(database_url: str, transactions: int, repeat: int) -> dict[str, Any]:
    engine = make_engine(database_url, pool_size=2)
    sessions = make_session_factory(engine)
    raw = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))

    async def orm_session() -> None:
        async with sessions() as session, session.begin():
            await session.execute(SELECT_1)

    async def core_connection() -> None:
        async with engine.begin() as connection:
            await connection.execute(SELECT_1)

    async def bare_asyncpg() -> None:
        async with raw.transaction():
            await raw.fetchval("SELECT 1")

    ways = {"orm_session": orm_session, "core_connection": core_connection, "asyncpg": bare_asyncpg}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
    try:
        for repetition in range(repeat):
            for name, body in ways.items():
                runs[name].append(await _time(body, transactions))
                figures = runs[name][-1]
                print(
                    f"[{repetition + 1}] {name:<16} user {figures['user_us']:6.0f} us  system "
                    f"{figures['system_us']:5.0f} us  wall {figures['wall_us']:6.0f} us",
                    file=sys.stderr,
                )
    finally:
        await raw.close()
        await engine.dispose()
    result: dict[str, Any] = {
        name: {key: round(statistics.median(r[key] for r in done), 1) for key in done[0]}
        for name, done in runs.items()
    }
    bare = result["asyncpg"]["user_us"]
    result["orm_over_asyncpg_user"] = round(result["orm_session"]["user_us"] / bare, 2) if bare else None
    result.update(transactions=transactions, repetitions=repeat, per_repetition=runs)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.db_transaction",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--transactions", type=int, default=2000, help="per way and repetition (default 2000)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of the three ways (default 3)")
    parser.add_argument("--database-url", help="an existing PostgreSQL (default: start an embedded one)")
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if min(args.transactions, args.repeat) < 1:
        parser.error("--transactions and --repeat must be at least 1")
    handles = []
    database_url = args.database_url
    if not database_url:
        from tessera.testing.infra import resolve_postgres

        server = resolve_postgres()
        server.start()
        handles.append(server)
        database_url = server.url
    load = [round(os.getloadavg()[0], 2)]
    try:
        result = asyncio.run(run(database_url, args.transactions, args.repeat))
    finally:
        for handle in handles:
            handle.close()
    result["load_average_1m"] = [*load, round(os.getloadavg()[0], 2)]
    for name in ("orm_session", "core_connection", "asyncpg"):
        figures = result[name]
        print(
            f"{name:<16} user {figures['user_us']:6.0f} us  system {figures['system_us']:5.0f} us  wall {figures['wall_us']:6.0f} us"
        )
    print(f"ORM session / bare asyncpg, user CPU: {result['orm_over_asyncpg_user']}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
