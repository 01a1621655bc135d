"""`bench.db_transaction` times the same transaction through each layer on a real PostgreSQL."""

from __future__ import annotations

import pytest

from bench.db_transaction import run

pytestmark = pytest.mark.integration


async def test_each_layer_is_timed_with_its_cpu_and_wall_time(fresh_database: str) -> None:
    result = await run(fresh_database, transactions=30, repeat=2)

    for way in ("orm_session", "core_connection", "asyncpg"):
        assert len(result["per_repetition"][way]) == 2
        figures = result[way]
        assert figures["wall_us"] > 0 and figures["user_us"] + figures["system_us"] > 0
    bare = result["asyncpg"]["user_us"]
    if bare:  # CPU accounting may round a few bare transactions down to nothing
        assert result["orm_over_asyncpg_user"] == round(result["orm_session"]["user_us"] / bare, 2)
    else:
        assert result["orm_over_asyncpg_user"] is None
