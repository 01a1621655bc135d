"""The CLI's bearer token (TESSERA_TOKEN, else the state directory's admin-token) and `tessera
tokens`' durations and expiry times (UTC unless a zone is given)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner

from tessera.admission.admin_token import ADMIN_TOKEN_FILE
from tessera.cli import client, tokens
from tessera.cli.main import app
from tessera.cli.tokens import parse_duration


def test_the_admin_token_in_the_state_dir_is_sent_unless_tessera_token_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TESSERA_TOKEN", raising=False)
    monkeypatch.setenv("TESSERA_STATE_DIR", str(tmp_path))
    monkeypatch.setattr(client.settings, "state_dir", None)
    with client.admission_client("http://admission") as http:
        assert "Authorization" not in http.headers
    assert client.ADMIN_TOKEN_FILE == ADMIN_TOKEN_FILE
    (tmp_path / ADMIN_TOKEN_FILE).write_text("tsr_admin\n")
    with client.admission_client("http://admission") as http:
        assert http.headers["Authorization"] == "Bearer tsr_admin"
    monkeypatch.setenv("TESSERA_TOKEN", "tsr_tenant")
    with client.admission_client("http://admission") as http:
        assert http.headers["Authorization"] == "Bearer tsr_tenant"


@pytest.mark.parametrize(
    ("given", "seconds"), [("3600", 3600), ("90m", 5400), ("12h", 43200), ("30d", 2592000), (" 5s ", 5)]
)
def test_durations(given: str, seconds: int) -> None:
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("given", ["", "0", "1w", "-5", "1.5h", "h"])
def test_bad_durations_name_the_option(given: str) -> None:
    with pytest.raises(typer.BadParameter, match="not a duration"):
        parse_duration(given)


@pytest.fixture
def tokyo(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The local zone is Asia/Tokyo (UTC+9) for the test."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.usefixtures("tokyo")
@pytest.mark.parametrize(
    ("given", "sent"),
    [
        ("2027-01-01T00:00:00", "2027-01-01T00:00:00+00:00"),  # no zone: UTC, as the help says
        ("2027-01-01 12:30", "2027-01-01T12:30:00+00:00"),
        ("0001-01-01", "0001-01-01T00:00:00+00:00"),
        ("2027-01-01T09:00:00+09:00", "2027-01-01T09:00:00+09:00"),  # a zone given is kept
    ],
)
def test_expires_at_without_a_zone_is_utc(given: str, sent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert time.localtime(0).tm_gmtoff == 9 * 3600
    posted: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        made = {"token": "tsr_x", "id": "t-1", "expires_at": posted[-1]["expires_at"]}
        return httpx.Response(201, json=made)

    def fake(api: str | None, handled: frozenset[int] = frozenset()) -> httpx.Client:
        return httpx.Client(base_url="http://admission", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(tokens, "_client", fake)
    result = CliRunner().invoke(app, ["tokens", "create", "team-a", "--expires-at", given])
    assert result.exit_code == 0, result.output
    assert posted == [{"tenant": "team-a", "expires_at": sent}]
