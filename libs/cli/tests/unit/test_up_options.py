"""``tessera up``'s options, its plan for the services and its help."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tessera.cli.up import (
    DEFAULT_CLUSTER_FILE,
    SERVICES,
    check_url,
    default_service_argv,
    parse_services,
    plan_services,
    register,
    resolve_cluster_file,
)
from tessera.cli.up_console import _hide_password
from tessera.core.embedded import StateDir


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (None, SERVICES),
        ([], SERVICES),
        (["admission"], ("admission",)),
        (["admission,scheduler"], ("admission", "scheduler")),
        (["scheduler", "admission, slicing"], ("scheduler", "admission", "slicing")),
        (["admission", "admission"], ("admission",)),
    ],
)
def test_parse_services(values: list[str] | None, expected: tuple[str, ...]) -> None:
    assert parse_services(values) == expected


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["admision"], "unknown service(s) admision"),
        (["admission,gpu"], "unknown service(s) gpu"),
        ([" , "], "name at least one service"),
    ],
)
def test_parse_services_names_the_flag_and_the_reason(values: list[str], message: str) -> None:
    with pytest.raises(typer.BadParameter, match=r"unknown|at least") as err:
        parse_services(values)
    assert message in str(err.value)
    assert err.value.param_hint == "--services"


@pytest.mark.parametrize(
    ("value", "schemes", "expected"),
    [
        (None, ("nats",), None),
        ("  ", ("nats",), None),
        ("nats://h:4222", ("nats", "tls"), "nats://h:4222"),
        (" postgresql://u:p@h:5432/db ", ("postgresql", "postgres"), "postgresql://u:p@h:5432/db"),
    ],
)
def test_check_url_accepts(value: str | None, schemes: tuple[str, ...], expected: str | None) -> None:
    assert check_url(value, schemes, "--x") == expected


def test_check_url_rejects_a_wrong_scheme_naming_the_flag() -> None:
    with pytest.raises(typer.BadParameter, match="scheme postgresql or postgres") as err:
        check_url("mysql://h/db", ("postgresql", "postgres"), "--database-url")
    assert err.value.param_hint == "--database-url"


def test_plan_gives_each_service_its_port_urls_and_log() -> None:
    state = StateDir(Path("/state"))
    specs, endpoints = plan_services(
        ["admission", "slicing"],
        {"admission": 18080, "slicing": 19000},
        nats_url="nats://127.0.0.1:14222",
        database_url="postgresql://t:t@127.0.0.1:15432/tessera",
        kubeconfig=Path("/k/config"),
        state=state,
        service_argv=lambda n: ["run", n],
    )

    assert [s.name for s in specs] == ["admission", "slicing"]
    assert specs[1].argv == ["run", "slicing"]
    assert specs[1].log_file == Path("/state/logs/slicing.log")
    assert specs[1].env == {
        "TESSERA_NATS_URL": "nats://127.0.0.1:14222",
        "TESSERA_DATABASE_URL": "postgresql://t:t@127.0.0.1:15432/tessera",
        "TESSERA_SLICING_HTTP_HOST": "127.0.0.1",
        "TESSERA_SLICING_HTTP_PORT": "19000",
        "TESSERA_KUBECONFIG": "/k/config",
        "TESSERA_SLICING_LEADER_ELECTION__ENABLED": "false",
    }
    assert "TESSERA_ADMISSION_LEADER_ELECTION__ENABLED" not in specs[0].env
    assert endpoints.admission_api_url == "http://127.0.0.1:18080"
    assert endpoints.services["slicing"].health_url == "http://127.0.0.1:19000/healthz"
    assert endpoints.services["slicing"].ready_url == "http://127.0.0.1:19000/readyz"
    assert endpoints.kubeconfig == "/k/config"


def test_only_telemetry_gets_the_cluster_file() -> None:
    specs, _ = plan_services(
        ["telemetry", "scheduler"],
        {"telemetry": 1, "scheduler": 2},
        nats_url="nats://n",
        database_url="postgresql://d",
        kubeconfig=None,
        state=StateDir(Path("/s")),
        service_argv=default_service_argv,
        cluster_file=Path("/c/dev.yaml"),
    )
    assert specs[0].env["TESSERA_TELEMETRY_CLUSTER_FILE"] == "/c/dev.yaml"
    assert "TESSERA_TELEMETRY_CLUSTER_FILE" not in specs[1].env


def test_the_services_reading_for_tenants_check_tokens_with_admission_as_open_as_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a local stack the checkpoint service's, the forecaster's and telemetry's tenant-facing reads ask
    the stack's own admission about a bearer token, and are open exactly when admission is."""
    readers = ["telemetry", "checkpoint", "forecaster"]

    def envs() -> dict[str, dict[str, str]]:
        specs, _ = plan_services(
            ["admission", *readers, "scheduler"],
            {"admission": 18080, "telemetry": 1, "checkpoint": 2, "forecaster": 4, "scheduler": 3},
            nats_url="nats://n",
            database_url="postgresql://d",
            kubeconfig=None,
            state=StateDir(Path("/s")),
            service_argv=default_service_argv,
        )
        return {s.name: s.env for s in specs}

    monkeypatch.delenv("TESSERA_ADMISSION_AUTH", raising=False)
    for name in readers:
        prefix = f"TESSERA_{name.upper()}_"
        assert envs()[name][prefix + "AUTH"] == "disabled"
        assert envs()[name][prefix + "ADMISSION_URL"] == "http://127.0.0.1:18080"
    assert not any(key.endswith("_ADMISSION_URL") for key in envs()["scheduler"])
    monkeypatch.setenv("TESSERA_ADMISSION_AUTH", "required")
    assert {envs()[name][f"TESSERA_{name.upper()}_AUTH"] for name in readers} == {"required"}


def test_cluster_file_given_must_exist(tmp_path: Path) -> None:
    with pytest.raises(typer.BadParameter, match="is not a file") as err:
        resolve_cluster_file(tmp_path / "missing.yaml", needed=True)
    assert err.value.param_hint == "--cluster-file"


def test_cluster_file_defaults_to_the_example_when_run_from_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(typer.BadParameter, match="telemetry needs a cluster file"):
        resolve_cluster_file(None, needed=True)
    assert resolve_cluster_file(None, needed=False) is None

    (tmp_path / DEFAULT_CLUSTER_FILE).parent.mkdir(parents=True)
    (tmp_path / DEFAULT_CLUSTER_FILE).write_text("nodes: []\n")
    assert resolve_cluster_file(None, needed=True) == (tmp_path / DEFAULT_CLUSTER_FILE).resolve()


def test_plan_without_admission_has_no_api_url_and_no_kubeconfig() -> None:
    specs, endpoints = plan_services(
        ["scheduler"],
        {"scheduler": 1},
        nats_url="nats://n",
        database_url="postgresql://d",
        kubeconfig=None,
        state=StateDir(Path("/s")),
        service_argv=default_service_argv,
    )
    assert endpoints.admission_api_url is None
    assert "TESSERA_KUBECONFIG" not in specs[0].env
    assert specs[0].argv[1:] == ["-m", "tessera.scheduler"]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://tessera:secret@127.0.0.1:1/db", "postgresql://tessera:***@127.0.0.1:1/db"),
        ("postgresql://tessera@127.0.0.1:1/db", "postgresql://tessera@127.0.0.1:1/db"),
        ("postgresql://127.0.0.1:1/db", "postgresql://127.0.0.1:1/db"),
    ],
)
def test_the_table_hides_passwords(url: str, shown: str) -> None:
    assert _hide_password(url) == shown


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command()
    def other() -> None:  # a second command, so that "up" is a subcommand as in the real app
        """Unused."""

    return app


def test_help_lists_every_option() -> None:
    result = CliRunner().invoke(_app(), ["up", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0
    for option in (
        "--state-dir",
        "--services",
        "--nats-url",
        "--database-url",
        "--kubeconfig",
        "--ready-timeout",
        "--no-devcluster",
        "--devcluster-speed",
        "--otlp-endpoint",
    ):
        assert option in result.output
    assert "TESSERA_NATS_URL" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--services", "nope"], "unknown service(s) nope"),
        (["--nats-url", "http://x"], "is not a URL with scheme nats or tls"),
        (["--kubeconfig", "/definitely/not/here"], "is not a file"),
        (["--otlp-endpoint", "grpc://x:4317"], "is not a URL with scheme http or https"),
    ],
)
def test_bad_options_fail_before_starting_anything(args: list[str], message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        _app(), ["up", "--state-dir", str(tmp_path / "s"), *args], env={"COLUMNS": "200", "NO_COLOR": "1"}
    )
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "s").exists()


def test_only_telemetry_reads_the_devcluster() -> None:
    specs, endpoints = plan_services(
        ["telemetry", "scheduler"],
        {"telemetry": 1, "scheduler": 2},
        nats_url="nats://n",
        database_url="postgresql://d",
        kubeconfig=Path("/s/kubeconfig"),
        state=StateDir(Path("/s")),
        service_argv=default_service_argv,
        devcluster_url="http://127.0.0.1:16443",
    )
    assert specs[0].env["TESSERA_TELEMETRY_DEVCLUSTER_URL"] == "http://127.0.0.1:16443"
    assert "TESSERA_TELEMETRY_DEVCLUSTER_URL" not in specs[1].env
    assert all(s.env["TESSERA_KUBECONFIG"] == "/s/kubeconfig" for s in specs)
    assert endpoints.kubeconfig == "/s/kubeconfig"


def test_every_service_exports_its_spans_to_the_otlp_endpoint_given() -> None:
    def plan(otlp_endpoint: str | None) -> list[dict[str, str]]:
        specs, _ = plan_services(
            ["admission", "scheduler"],
            {"admission": 1, "scheduler": 2},
            nats_url="nats://n",
            database_url="postgresql://d",
            kubeconfig=None,
            state=StateDir(Path("/s")),
            service_argv=default_service_argv,
            otlp_endpoint=otlp_endpoint,
        )
        return [dict(s.env) for s in specs]

    assert all(
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318" for env in plan("http://127.0.0.1:4318")
    )
    assert all("OTEL_EXPORTER_OTLP_ENDPOINT" not in env for env in plan(None))


def test_with_credentials_each_service_gets_its_own_nats_user_and_inbox_prefix(tmp_path: Path) -> None:
    from tessera.cli.up_auth import StackAuth
    from tessera.core.embedded import NatsServer

    state = StateDir(tmp_path)
    auth = StackAuth(state, SERVICES)
    nats = NatsServer(state.nats_store, port=14999)
    auth.nats_server(nats, {"research"})
    admin = auth.admin_nats_url(nats.url)
    specs, endpoints = plan_services(
        ["scheduler"],
        {"scheduler": 1},
        nats_url=admin,
        database_url="postgresql://t:t@127.0.0.1:15432/tessera",
        kubeconfig=None,
        state=state,
        service_argv=default_service_argv,
        access=lambda name: auth.access(name, admin, "postgresql://t:t@127.0.0.1:15432/tessera"),
    )
    env = specs[0].env
    password = auth.nats.password("tessera-scheduler")
    assert env["TESSERA_NATS_URL"] == f"nats://tessera-scheduler:{password}@127.0.0.1:14999"
    assert env["TESSERA_SCHEDULER_NATS_INBOX_PREFIX"] == "_INBOX_tessera-scheduler"
    assert endpoints.nats_url == admin and admin.startswith("nats://tessera-admin:")
    assert nats.config_file == state.credentials / "nats.conf"
    assert nats.command()[-2:] == ["--config", str(state.credentials / "nats.conf")]
    assert (state.credentials / "tenants" / "research.json").exists()
    # no role until one was granted (a given database is used as given)
    assert env["TESSERA_DATABASE_URL"] == "postgresql://t:t@127.0.0.1:15432/tessera"


def test_the_single_scheduler_of_tessera_up_elects_no_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Restarted after a crash, it decides at once instead of waiting out its old self's lease."""
    from tessera.scheduler.config import SchedulerSettings

    specs, _ = plan_services(
        ["scheduler"],
        {"scheduler": 2},
        nats_url="nats://n",
        database_url="postgresql://d",
        kubeconfig=Path("/k/config"),
        state=StateDir(Path("/s")),
        service_argv=default_service_argv,
    )
    for key, value in specs[0].env.items():
        monkeypatch.setenv(key, value)
    assert SchedulerSettings().leader_election.enabled is False
