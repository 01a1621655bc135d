"""``tessera devcluster`` and the devcluster process ``tessera up`` runs: options, paths, command line."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from tessera.cli.devcluster import (
    OPENB_PODS,
    DevclusterProcess,
    app,
    devcluster_url,
    resolve_trace,
    write_default_cluster,
)
from tessera.cluster.cluster_file import default_cluster, load_cluster

ENV = {"COLUMNS": "200", "NO_COLOR": "1"}
TRACE = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    (tmp_path / "openb").mkdir()
    (tmp_path / OPENB_PODS).write_text(TRACE + "openb-pod-0001,8000,32768,1,1000,,LS,Running,10,100,12\n")
    return tmp_path


def test_the_trace_defaults_to_the_openb_default_list_in_the_data_dir(data_dir: Path) -> None:
    assert resolve_trace(None, data_dir) == data_dir / OPENB_PODS


def test_a_bare_trace_name_is_looked_up_in_the_data_dir(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path / "openb")
    assert resolve_trace(Path("openb_pod_list_default.csv"), data_dir) == Path("openb_pod_list_default.csv")
    monkeypatch.chdir("/")
    assert resolve_trace(Path("openb_pod_list_default.csv"), data_dir) == data_dir / OPENB_PODS


def test_a_missing_trace_names_the_flag_and_the_data_dir(tmp_path: Path) -> None:
    with pytest.raises(typer.BadParameter, match="set TESSERA_DATA_DIR") as err:
        resolve_trace(Path("nope.csv"), tmp_path)
    assert err.value.param_hint == "--pods"


def test_replay_dry_run_uses_the_data_dir(data_dir: Path) -> None:
    result = CliRunner().invoke(app, ["replay", "--dry-run", "--data-dir", str(data_dir)], env=ENV)
    assert result.exit_code == 0, result.output
    assert "would create openb-pod-0001" in result.output


def test_replay_without_a_stack_says_to_start_one(data_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["replay", "--data-dir", str(data_dir), "--kubeconfig", str(tmp_path / "missing")],
        env=ENV,
    )
    assert result.exit_code == 2
    assert "start `tessera up` first" in " ".join(result.output.split())


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(app, ["--help"], env=ENV)
    assert result.exit_code == 0
    for command in ("replay", "nvml", "fault"):
        assert command in result.output


def test_the_devcluster_url_comes_from_the_kubeconfig(tmp_path: Path) -> None:
    from tessera.devcluster.apiserver.server import write_kubeconfig

    path = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:16443/")
    assert devcluster_url(path) == "http://127.0.0.1:16443"
    (tmp_path / "broken").write_text(yaml.safe_dump({"current-context": "x"}))
    with pytest.raises(typer.BadParameter, match="no server for the current context 'x'"):
        devcluster_url(tmp_path / "broken")


def test_the_default_cluster_is_the_dev_4x8_cluster(tmp_path: Path) -> None:
    written = load_cluster(write_default_cluster(tmp_path / "c.yaml"))
    assert written == default_cluster()
    repository_file = Path(__file__).parents[4] / "examples" / "clusters" / "dev-4x8.yaml"
    assert written == load_cluster(repository_file)


def test_the_devcluster_process_command_line(tmp_path: Path) -> None:
    process = DevclusterProcess(
        cluster_file=tmp_path / "c.yaml",
        kubeconfig=tmp_path / "kubeconfig",
        port=16443,
        log_file=tmp_path / "devcluster.log",
        speed=100,
    )
    assert process.url == "http://127.0.0.1:16443"
    assert process.command()[1:] == [
        "-m",
        "tessera.devcluster",
        "serve",
        "--cluster",
        str(tmp_path / "c.yaml"),
        "--kubeconfig",
        str(tmp_path / "kubeconfig"),
        "--host",
        "127.0.0.1",
        "--port",
        "16443",
        "--speed",
        "100",
    ]
    (tmp_path / "kubeconfig").write_text("stale")
    process.prepare()
    assert not process.is_ready()  # a stale kubeconfig is removed before the start


@pytest.mark.parametrize(("gangs", "paths"), [(False, ["pods"]), (True, ["podgroups", "pods"])])
def test_pods_are_created_over_http_as_gangs_of_one_when_asked(gangs: bool, paths: list[str]) -> None:
    import json

    import httpx

    from tessera.cli.devcluster import http_pod_creator

    seen: list[tuple[str, dict[str, object]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, json.loads(request.content)))
        return httpx.Response(201, json={})

    created: list[str] = []
    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        create = http_pod_creator(http, "http://dev:1", gangs=gangs, on_created=created.append)
        create({"metadata": {"name": "p-1", "namespace": "ns", "labels": {}}, "spec": {}})
    assert [path.rsplit("/", 1)[1] for path, _ in seen] == paths
    pod = seen[-1][1]
    assert seen[-1][0] == "/api/v1/namespaces/ns/pods" and created == ["p-1"]
    labels = pod["metadata"]["labels"]  # type: ignore[index]
    if gangs:
        assert seen[0][0] == "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups"
        assert seen[0][1]["spec"] == {"minMember": 1}
        assert labels == {"scheduling.x-k8s.io/pod-group": "p-1"}
    else:
        assert labels == {}


def test_a_refused_creation_names_the_status() -> None:
    import httpx

    from tessera.cli.devcluster import http_pod_creator

    with httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(409, text="exists"))) as http:
        create = http_pod_creator(http, "http://dev:1", gangs=False)
        with pytest.raises(RuntimeError, match="409 exists"):
            create({"metadata": {"name": "p", "namespace": "ns"}, "spec": {}})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("2m", 120.0),
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("1h", 3600.0),
        ("1.5m", 90.0),
        ("0s", 0.0),
    ],
)
def test_durations_take_a_number_and_a_unit(text: str, seconds: float) -> None:
    from tessera.cli.devcluster import parse_duration

    assert parse_duration(text, "--notice") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("30", "'30' has no unit; write e.g. 30s or 30m"),
        ("soon", "'soon' is not a duration"),
        ("-5s", "'-5s' is not a duration"),
        ("5 s", "'5 s' is not a duration"),
        ("", "'' is not a duration"),
    ],
)
def test_a_bad_duration_names_the_flag(text: str, problem: str) -> None:
    from tessera.cli.devcluster import parse_duration

    with pytest.raises(typer.BadParameter, match=problem) as err:
        parse_duration(text, "--notice")
    assert err.value.param_hint == "--notice"


def test_a_bad_notice_is_refused_before_any_request(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-kubeconfig")
    result = CliRunner().invoke(
        app, ["fault", "gpu-0", "spot-interruption", "--notice", "30", "--kubeconfig", missing], env=ENV
    )
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert "Invalid value for --notice: '30' has no unit" in output


def test_a_notice_belongs_to_spot_interruptions_only(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["fault", "gpu-0", "xid", "--gpu", "1", "--notice", "30s", "--kubeconfig", str(tmp_path)],
        env=ENV,
    )
    assert result.exit_code == 2
    assert "only a spot-interruption takes a notice" in " ".join(result.output.split())


def test_an_unknown_fault_kind_is_named() -> None:
    result = CliRunner().invoke(app, ["fault", "gpu-0", "meteor"], env=ENV)
    assert result.exit_code == 2
    assert "'meteor' is not a fault; expected one of xid, overheating, lost, spot-interruption" in " ".join(
        result.output.split()
    )


def test_fault_help_explains_the_spot_interruption() -> None:
    result = CliRunner().invoke(app, ["fault", "--help"], env=ENV)
    assert result.exit_code == 0
    output = " ".join(result.output.split())
    for expected in (
        "spot-interruption",
        "aws-node-termination-handler/spot-itn, NoSchedule",
        "tessera.io/termination-deadline",
        "the node is deleted and the pods still on it fail with NodeLost",
        "--notice",
        "e.g. 30s, 2m, 1m30s",
        "default 2m",
    ):
        assert expected in output, expected


@pytest.mark.parametrize(
    ("argv", "body"),
    [
        (
            ["gpu-0", "spot-interruption", "--notice", "1m30s"],
            {"kind": "spot-interruption", "notice_s": 90.0},
        ),
        (["gpu-0", "spot-interruption"], {"kind": "spot-interruption", "notice_s": 120.0}),
        (["gpu-0", "--gpu", "3"], {"kind": "xid", "gpu": 3, "code": 79}),
        (["gpu-0", "--kind", "overheating", "--gpu", "1"], {"kind": "overheating", "gpu": 1, "code": 79}),
    ],
)
def test_the_fault_command_posts_the_fault(
    argv: list[str], body: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from tessera.devcluster.apiserver.server import write_kubeconfig

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:16443/")
    posted: list[tuple[str, object]] = []

    def post(url: str, json: object, timeout: float) -> httpx.Response:
        posted.append((url, json))
        return httpx.Response(200, json={"node": "gpu-0", "injected": json})

    monkeypatch.setattr(httpx, "post", post)
    result = CliRunner().invoke(app, ["fault", *argv, "--kubeconfig", str(kubeconfig)], env=ENV)

    assert result.exit_code == 0, result.output
    assert posted == [("http://127.0.0.1:16443/faults/gpu-0", body)]


def test_the_devcluster_process_gets_the_nats_url_in_its_environment(tmp_path: Path) -> None:
    from tessera.cli.devcluster import NATS_URL_ENV

    process = DevclusterProcess(
        cluster_file=tmp_path / "c.yaml",
        kubeconfig=tmp_path / "kubeconfig",
        port=16443,
        log_file=tmp_path / "devcluster.log",
        nats_url="nats://user:secret@127.0.0.1:14222",
        checkpoint_root=(tmp_path / "checkpoints").as_uri(),
    )
    env = process.env()
    assert env is not None and env[NATS_URL_ENV] == "nats://user:secret@127.0.0.1:14222"
    assert "PATH" in env  # the rest of the environment is kept
    argv = process.command()
    assert argv[-2:] == ["--checkpoint-root", (tmp_path / "checkpoints").as_uri()]
    assert not any("secret" in arg for arg in argv)  # never on the command line, where ps shows it
    plain = DevclusterProcess(
        cluster_file=tmp_path / "c.yaml", kubeconfig=tmp_path / "k", port=1, log_file=tmp_path / "l"
    )
    assert plain.env() is None and "--checkpoint-root" not in plain.command()


def test_the_devcluster_reads_the_nats_url_that_tessera_up_hands_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera.cli.devcluster import NATS_URL_ENV
    from tessera.devcluster import cli as devcluster_cli

    assert devcluster_cli.NATS_URL_ENV == NATS_URL_ENV
    monkeypatch.setenv(NATS_URL_ENV, "nats://127.0.0.1:4222")
    args = devcluster_cli.build_parser().parse_args(["serve", "--cluster", "c.yaml"])
    assert args.nats_url == "nats://127.0.0.1:4222" and args.checkpoint_root is None
    monkeypatch.delenv(NATS_URL_ENV)
    assert devcluster_cli.build_parser().parse_args(["serve", "--cluster", "c.yaml"]).nats_url is None


def test_without_a_kubeconfig_the_one_in_the_state_dir_is_used(tmp_path: Path) -> None:
    from tessera.cli.main import app as tessera

    state = tmp_path / "stack"
    result = CliRunner().invoke(tessera, ["--state-dir", str(state), "devcluster", "layout"], env=ENV)
    assert result.exit_code == 2
    assert f"{state / 'kubeconfig'} does not exist" in " ".join(result.output.split())
