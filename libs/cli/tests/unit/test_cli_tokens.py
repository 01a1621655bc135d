"""The CLI's bearer token (TESSERA_TOKEN, else the state directory's admin-token) and `tessera
tokens`' durations."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from tessera.admission.admin_token import ADMIN_TOKEN_FILE
from tessera.cli import client
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
