"""Bad input to `tessera` is refused with the option or field at fault and the reason, never a
traceback: times out of range, job files JSON cannot carry, a malformed database URL or kubeconfig.
A YAML date or timestamp in a job file reaches admission as the string written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import typer
from typer.testing import CliRunner, Result

from tessera.cli import jobs, usage
from tessera.cli.main import app

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def refused(result: Result, *texts: str) -> str:
    """The run ended as a usage error (exit 2), without an exception, saying each of ``texts``."""
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    said = " ".join(result.output.replace("│", " ").split())
    for text in texts:
        assert text in said, said
    return said


@pytest.mark.parametrize(
    ("given", "option"),
    [
        (["--from", "1000000d"], "--from"),
        (["--from", "99999999999999999999999d"], "--from"),
        (["--from", "0001-01-01T00:00+01:00"], "--from"),
        (["--to", "9999-12-31T23:00-05:00"], "--to"),
        (["--to", "0001-01-01T00:00", "--from", "1d"], "--from"),
    ],
)
def test_a_time_out_of_range_names_the_option(
    given: list[str], option: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TESSERA_TELEMETRY_URL", "http://127.0.0.1:1")
    for command in (["usage"], ["usage", "report", "--json"]):
        result = CliRunner().invoke(app, [*command, *given], env={"COLUMNS": "200"})
        refused(result, f"Invalid value for {option}", "is out of range", "years 1 to 9999")


def test_parse_time_refuses_an_age_too_long() -> None:
    with pytest.raises(typer.BadParameter, match="out of range"):
        usage.parse_time("1000000d", NOW)
    assert usage.parse_time("1d", NOW, "--to") == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def admission(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """What `tessera jobs submit` posted (as JSON); admission answers 201."""
    posted: list[object] = []

    def answer(request: httpx.Request) -> httpx.Response:
        posted.append(json.loads(request.content))
        return httpx.Response(201, json={"id": "j-1"})

    def client(api: str | None, handled: frozenset[int] = frozenset()) -> httpx.Client:
        return httpx.Client(base_url="http://admission", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(jobs, "_client", client)
    yield posted


def test_yaml_dates_and_timestamps_reach_admission_as_written(
    admission: list[object], tmp_path: Path
) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: train-2024-01-01\ntenant: acme\nqueue: default\n"
        "labels:\n  release: 2024-01-01\n  built: 2024-01-01T10:00:00Z\n  at: 2024-1-1 10:00:00.5\n"
        "not_before: 2024-01-01\n"
    )
    result = CliRunner().invoke(app, ["jobs", "submit", str(spec)])
    assert result.exit_code == 0, result.output
    assert admission == [
        {
            "name": "train-2024-01-01",
            "tenant": "acme",
            "queue": "default",
            "labels": {"release": "2024-01-01", "built": "2024-01-01T10:00:00Z", "at": "2024-1-1 10:00:00.5"},
            "not_before": "2024-01-01",
        }
    ]


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("inf.yaml", "a:\n  b: [1, .inf]\n", "a.b.1 is inf, which JSON cannot carry"),
        ("nan.json", '{"a": NaN}', "a is nan, which JSON cannot carry"),
        ("bin.yaml", "labels:\n  x: !!binary aGVsbG8=\n", "labels.x is a bytes"),
        ("set.yaml", "a: !!set {x}\n", "a is a set"),
        ("ts.yaml", "a: !!timestamp 2024-01-01\n", "a is a date"),
        ("key.yaml", "? !!binary aGk=\n: 1\n", "the key"),
        ("loop.yaml", "a: &x [1, *x]\n", "a.1 refers back to a mapping or list that holds it"),
        ("deep.json", "[" * 5_000 + "]" * 5_000, "nested too deeply"),
        ("deep.yaml", "[" * 5_000 + "]" * 5_000, "nested too deeply"),
    ],
)
def test_a_job_file_json_cannot_carry_is_refused_naming_the_field(
    name: str, text: str, says: str, admission: list[object], tmp_path: Path
) -> None:
    (tmp_path / name).write_text(text)
    for command in (["jobs", "submit"], ["queues", "apply"]):
        result = CliRunner().invoke(app, [*command, str(tmp_path / name)], env={"COLUMNS": "200"})
        refused(result, says)
    assert admission == []


def test_a_job_file_that_is_not_utf8_is_named(admission: list[object], tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_bytes(b"\xff\xfename: x\n")
    result = CliRunner().invoke(app, ["jobs", "submit", str(tmp_path / "job.yaml")], env={"COLUMNS": "200"})
    refused(result, "job.yaml is not UTF-8 text")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("nonsense", "not a database URL"),
        ("postgresql://x@[::1:1/db", "not a database URL"),
        ("mysql://u@h/db", "'mysql' is not PostgreSQL"),
    ],
)
def test_a_malformed_database_url_names_the_option(url: str, says: str) -> None:
    result = CliRunner().invoke(app, ["migrate", "--database-url", url], env={"COLUMNS": "200"})
    refused(result, "Invalid value for --database-url", says)


def test_a_database_that_refuses_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy.exc import OperationalError

    from tessera.core.db import migrations

    def refuse(name: str, url: str) -> None:
        raise OperationalError("connect", {}, Exception('password authentication failed for user "x"'))

    monkeypatch.setattr(migrations, "migrate", refuse)
    result = CliRunner().invoke(
        app, ["migrate", "admission", "--database-url", "postgresql://x:y@db/t"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert 'cannot migrate admission: password authentication failed for user "x"' in result.output


@pytest.mark.parametrize(
    "text",
    [
        "garbage\n",
        "x: [\n",
        "contexts: 3\n",
        "contexts: [a]\n",
        "current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n"
        "clusters: [{name: k, cluster: {server: 5}}]\n",
    ],
)
def test_a_malformed_kubeconfig_names_the_option(text: str, tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text(text)
    for command in (["devcluster", "layout"], ["devcluster", "nvml"]):
        result = CliRunner().invoke(
            app, [*command, "--kubeconfig", str(tmp_path / "kubeconfig")], env={"COLUMNS": "200"}
        )
        refused(result, "Invalid value for --kubeconfig")
