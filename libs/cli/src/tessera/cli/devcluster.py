"""The devcluster from the ``tessera`` CLI: the process ``tessera up`` runs, and ``tessera devcluster``.

``tessera up`` runs the devcluster (``python -m tessera.devcluster serve``) as a child process of its
own, beside NATS and PostgreSQL: it is infrastructure the services talk to over HTTP, it is busy
under a trace replay (a process of its own gets a core of its own), and its log is its own. It keeps
its objects and simulated hardware in ``STATE_DIR/devcluster/state.json``, so the next ``tessera up``
finds the pods it left running, and ``tessera up`` restarts it, with them, when it dies, as it does
NATS and PostgreSQL (docs/adr/0027-supervised-local-stack.md). See docs/adr/0008-telemetry-sources.md.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console

from tessera.cli.client import state_dir
from tessera.core.embedded.process import ManagedProcess
from tessera.devcluster import data

DEFAULT_DEVCLUSTER_PORT = 16443
NATS_URL_ENV = "TESSERA_DEVCLUSTER_NATS_URL"
DEFAULT_KUBECONFIG = Path(".tessera/kubeconfig")
OPENB_PODS = data.OPENB_PODS
#: the cluster ``tessera up`` simulates when no cluster file is given (examples/clusters/dev-4x8.yaml)
DEV_4X8 = {
    "nodes": [
        {
            "name_prefix": "gpu-node-",
            "count": 4,
            "cpu": "96",
            "memory": "1Ti",
            "labels": {"topology.kubernetes.io/zone": "rack-a"},
            "gpus": {"count": 8, "model": "A100-80GB", "memory_mib": 81920},
        }
    ]
}


class DevclusterProcess(ManagedProcess):
    """``python -m tessera.devcluster serve`` on a loopback port, writing ``kubeconfig``."""

    component = "devcluster"

    def __init__(
        self,
        *,
        cluster_file: Path,
        kubeconfig: Path,
        port: int,
        log_file: Path,
        speed: float = 1.0,
        host: str = "127.0.0.1",
        nats_url: str | None = None,
        checkpoint_root: str | None = None,
        state_file: Path | None = None,
    ) -> None:
        super().__init__(log_file)
        self.cluster_file = cluster_file
        self.kubeconfig = kubeconfig
        self.port = port
        self.speed = speed
        self.host = host
        #: where the simulated trainers take save requests and report checkpoints
        self.nats_url = nats_url
        #: where they write checkpoints (the devcluster's default: beside the kubeconfig)
        self.checkpoint_root = checkpoint_root
        #: where the devcluster keeps its objects and simulated hardware across restarts
        self.state_file = state_file

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "tessera.devcluster",
            "serve",
            "--cluster",
            str(self.cluster_file),
            "--kubeconfig",
            str(self.kubeconfig),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--speed",
            f"{self.speed:g}",
        ]
        if self.checkpoint_root:
            argv += ["--checkpoint-root", self.checkpoint_root]
        if self.state_file is not None:
            argv += ["--state-file", str(self.state_file)]
        return argv

    def env(self) -> Mapping[str, str] | None:
        # in the environment rather than the command line, where a URL's credentials would show in ps
        if not self.nats_url:
            return None
        return {**os.environ, NATS_URL_ENV: self.nats_url}

    def prepare(self) -> None:
        # the kubeconfig appears once the API server listens: a stale one must not look ready
        self.kubeconfig.unlink(missing_ok=True)

    def is_ready(self) -> bool:
        if not self.kubeconfig.exists():
            return False
        try:
            return httpx.get(f"{self.url}/nvml", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False


def write_default_cluster(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# The default devcluster of `tessera up`: 4 nodes of 8 A100-80GB.\n" + yaml.safe_dump(DEV_4X8)
    )
    return path


# -- `tessera devcluster` --------------------------------------------------------------------------------
app = typer.Typer(
    help="The devcluster: a simulated GPU cluster on this machine (started by `tessera up`).",
    no_args_is_help=True,
)


def console() -> Console:
    """Standard output, as wide as the terminal (or COLUMNS) is when it is written."""
    return Console()


def default_data_dir() -> Path:
    """``$TESSERA_DATA_DIR``, else the traces bundled with the devcluster (as the devcluster resolves it)."""
    return data.data_dir()


def resolve_trace(pods: Path | None, data_dir: Path) -> Path:
    """``--pods`` as given when it exists, else the same name under the data directory's openb/."""
    if pods is None:
        candidate = data_dir / OPENB_PODS
    elif pods.exists() or pods.is_absolute():
        candidate = pods
    else:
        candidate = data_dir / "openb" / pods
        if not candidate.exists():
            candidate = data_dir / pods
    if not candidate.is_file():
        raise typer.BadParameter(
            f"{candidate} is not a file (data directory {data_dir}; set TESSERA_DATA_DIR or give a path)",
            param_hint="--pods",
        )
    return candidate


def _kubeconfig(path: Path) -> Path:
    if path == DEFAULT_KUBECONFIG:  # not given: the one `tessera up` wrote in the stack's state dir
        path = state_dir() / "kubeconfig"
    if not path.is_file():
        raise typer.BadParameter(
            f"{path} does not exist: start `tessera up` first, or give the kubeconfig of a devcluster",
            param_hint="--kubeconfig",
        )
    return path


def devcluster_url(kubeconfig: Path) -> str:
    """The API server of a kubeconfig's current context (the devcluster serves /nvml and /faults there)."""
    try:
        config = yaml.safe_load(kubeconfig.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(
            f"{kubeconfig} is not a kubeconfig: {exc}", param_hint="--kubeconfig"
        ) from None
    if not isinstance(config, dict):
        raise typer.BadParameter(
            f"{kubeconfig} is not a kubeconfig: it holds no mapping", param_hint="--kubeconfig"
        )
    current = config.get("current-context")
    try:
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or []}
        clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or []}
        server = clusters[contexts[current]["cluster"]]["server"]
    except (KeyError, TypeError):
        server = None
    if not isinstance(server, str):
        raise typer.BadParameter(
            f"{kubeconfig}: no server for the current context {current!r}", param_hint="--kubeconfig"
        )
    return server.rstrip("/")


def http_pod_creator(
    http: httpx.Client, url: str, *, gangs: bool, on_created: Callable[[str], None] | None = None
) -> Callable[[dict[str, Any]], None]:
    """Creates each manifest over HTTP; with ``gangs``, first a PodGroup of one named after the pod,
    with the pod-group label on the pod (how the scheduler takes a single pod as a gang)."""
    from tessera.cluster.builders import pod_group_manifest
    from tessera.cluster.conventions import POD_GROUP_API_VERSION, POD_GROUP_LABEL, POD_GROUP_PLURAL

    def post(path: str, body: dict[str, Any]) -> None:
        response = http.post(f"{url}{path}", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"{response.status_code} {response.text[:200]}")

    def create(manifest: dict[str, Any]) -> None:
        name, namespace = manifest["metadata"]["name"], manifest["metadata"]["namespace"]
        if gangs:
            groups = f"/apis/{POD_GROUP_API_VERSION}/namespaces/{namespace}/{POD_GROUP_PLURAL}"
            post(groups, pod_group_manifest(name, 1, namespace))
            manifest["metadata"].setdefault("labels", {})[POD_GROUP_LABEL] = name
        post(f"/api/v1/namespaces/{namespace}/pods", manifest)
        if on_created is not None:
            on_created(name)

    return create


KubeconfigOption = Annotated[
    Path,
    typer.Option(help="The devcluster's kubeconfig, as written by `tessera up`."),
]


@app.command()
def replay(
    pods: Annotated[
        Path | None,
        typer.Option(
            help="An openb pod list (CSV). A bare name is looked up under the data directory's openb/; "
            f"default: {OPENB_PODS} there."
        ),
    ] = None,
    speed: Annotated[float, typer.Option(min=0.001, help="Trace seconds per wall-clock second.")] = 1.0,
    kubeconfig: KubeconfigOption = DEFAULT_KUBECONFIG,
    namespace: Annotated[str, typer.Option(help="Namespace of the pods.")] = "default",
    scheduler: Annotated[str, typer.Option(help="schedulerName of the pods.")] = "tessera",
    skip: Annotated[int, typer.Option(min=0, help="Skip the first N pods of the trace.")] = 0,
    limit: Annotated[int | None, typer.Option(min=1, help="Replay at most N pods.")] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="TESSERA_DATA_DIR",
            help="Where the traces are; default: the traces bundled with the devcluster "
            "(libs/devcluster/src/tessera/devcluster/data/ in the repository).",
        ),
    ] = None,
    gangs: Annotated[
        bool,
        typer.Option(
            help="Create each pod as a gang of one: a PodGroup (minMember 1) and the pod-group label."
        ),
    ] = False,
    dry_run: Annotated[bool, typer.Option(help="Print what would be created; create nothing.")] = False,
) -> None:
    """Create pods from the openb trace at its creation times divided by --speed.

    Each row becomes a pod for Tessera's scheduler (GPU count, share of a GPU, allowed models, and
    its run time as `tessera.io/sim-duration`). Start `tessera up` first; run it at the same
    --devcluster-speed so that pods run for their traced time.
    """
    from tessera.devcluster.cli import main as devcluster_main

    trace = resolve_trace(pods, data_dir or default_data_dir())
    if gangs and not dry_run:
        raise typer.Exit(
            _replay_gangs(trace, speed, _kubeconfig(kubeconfig), namespace, scheduler, skip, limit)
        )
    argv = ["replay", "--pods", str(trace), "--speed", f"{speed:g}", "--namespace", namespace]
    argv += ["--scheduler", scheduler, "--skip", str(skip)]
    if limit is not None:
        argv += ["--limit", str(limit)]
    if dry_run:
        argv.append("--dry-run")
    else:
        argv += ["--kubeconfig", str(_kubeconfig(kubeconfig))]
    raise typer.Exit(devcluster_main(argv))


def _replay_gangs(
    trace: Path, speed: float, kubeconfig: Path, namespace: str, scheduler: str, skip: int, limit: int | None
) -> int:
    from tessera.devcluster.replay import Replayer, TraceError, load_trace

    try:
        pods = load_trace(trace, skip=skip, limit=limit)
    except TraceError as exc:
        console().print(f"[red]error:[/] {exc}")
        return 2
    with httpx.Client(timeout=30) as http:
        create = http_pod_creator(
            http,
            devcluster_url(kubeconfig),
            gangs=True,
            on_created=lambda n: print(f"created {n}", flush=True),
        )
        report = Replayer(create, speed=speed, namespace=namespace, scheduler=scheduler).run(pods)
    print(
        f"replayed {len(report.created)} pods, {len(report.failed)} rejected; max lag {report.max_lag_s:.3f}s"
    )
    for name, reason in report.failed:
        print(f"  rejected {name}: {reason}", file=sys.stderr)
    return 0 if not report.failed else 1


@app.command()
def nvml(
    node: Annotated[str | None, typer.Argument(help="A node; all nodes' names when omitted.")] = None,
    kubeconfig: KubeconfigOption = DEFAULT_KUBECONFIG,
) -> None:
    """Print what simulated NVML reads on a node's GPUs (JSON)."""
    url = devcluster_url(_kubeconfig(kubeconfig))
    answer = httpx.get(f"{url}/nvml" + (f"/{node}" if node else ""), timeout=10)
    if answer.status_code != 200:
        console().print(f"[red]error:[/] {answer.status_code}: {answer.text}")
        raise typer.Exit(1)
    console().print_json(answer.text)


@app.command()
def layout(kubeconfig: KubeconfigOption = DEFAULT_KUBECONFIG) -> None:
    """Print each GPU's current layout (exclusive, MIG instances, time-slicing or MPS replicas) with the
    MIG manager's and device plugin's config labels of its node."""
    from tessera.devcluster.layouts import gpu_rows, render

    url = devcluster_url(_kubeconfig(kubeconfig))
    answer = httpx.get(f"{url}/api/v1/nodes", timeout=10)
    if answer.status_code != 200:
        console().print(f"[red]error:[/] {answer.status_code}: {answer.text}")
        raise typer.Exit(1)
    print(render(gpu_rows(answer.json().get("items") or [])))


FAULT_KINDS = ("xid", "overheating", "lost", "spot-interruption")
#: what AWS gives before it reclaims a spot instance
DEFAULT_SPOT_NOTICE = "2m"
_NUMBER = r"\d+(?:\.\d*)?|\.\d+"
_DURATION_PART = re.compile(rf"({_NUMBER})(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, flag: str) -> float:
    """Seconds in a duration such as ``30s``, ``2m``, ``1m30s``, ``500ms`` or ``1h``; a bad one raises
    ``typer.BadParameter`` naming ``flag``."""
    cleaned = text.strip().lower()
    parts = list(_DURATION_PART.finditer(cleaned))
    if not cleaned or "".join(p.group(0) for p in parts) != cleaned:
        if re.fullmatch(_NUMBER, cleaned):
            problem = f"{text!r} has no unit; write e.g. {cleaned}s or {cleaned}m (units: ms, s, m, h)"
        else:
            problem = (
                f"{text!r} is not a duration; write a number and a unit (ms, s, m, h), e.g. 30s, 2m, 1m30s"
            )
        raise typer.BadParameter(problem, param_hint=flag)
    return sum(float(p.group(1)) * _UNIT_SECONDS[p.group(2)] for p in parts)


@app.command()
def fault(
    node: Annotated[str, typer.Argument(help="The node.")],
    kind: Annotated[
        str | None,
        typer.Argument(help="xid (the default), overheating, lost or spot-interruption.", show_default=False),
    ] = None,
    kind_option: Annotated[
        str | None, typer.Option("--kind", help="The same as KIND, for older scripts.", hidden=True)
    ] = None,
    gpu: Annotated[int | None, typer.Option(help="GPU index; omitted with lost: the whole node.")] = None,
    code: Annotated[int, typer.Option(help="The XID error code.")] = 79,
    notice: Annotated[
        str | None,
        typer.Option(
            help="spot-interruption: how long the node lives after the notice, e.g. 30s, 2m, 1m30s "
            f"(simulated time; default {DEFAULT_SPOT_NOTICE}, the notice AWS gives).",
            show_default=False,
        ),
    ] = None,
    clear: Annotated[
        bool, typer.Option(help="Clear the node's faults (and withdraw a pending spot interruption).")
    ] = False,
    kubeconfig: KubeconfigOption = DEFAULT_KUBECONFIG,
) -> None:
    """Inject a fault on a node, or clear its faults.

    GPU faults: an XID error, overheating or a lost GPU (--gpu N). lost without --gpu loses the whole node: it turns NotReady and its pods fail with NodeLost.

    spot-interruption: the cloud is about to reclaim the node. At once the node is tainted as the AWS Node Termination Handler does (aws-node-termination-handler/spot-itn, NoSchedule), cordoned, and marked with the tessera.io/termination-deadline annotation and a SpotInterruption condition. When the --notice runs out, the node is deleted and the pods still on it fail with NodeLost.

    Example: tessera devcluster fault gpu-node-0 spot-interruption --notice 30s
    """
    if kind is not None and kind_option is not None and kind != kind_option:
        raise typer.BadParameter(f"KIND is {kind!r} but --kind is {kind_option!r}", param_hint="--kind")
    chosen = kind or kind_option or "xid"
    if chosen not in FAULT_KINDS:
        raise typer.BadParameter(
            f"{chosen!r} is not a fault; expected one of {', '.join(FAULT_KINDS)}", param_hint="KIND"
        )
    body: dict[str, Any] = {"kind": chosen, "gpu": gpu, "code": code}
    if chosen == "spot-interruption":
        body = {"kind": chosen, "notice_s": parse_duration(notice or DEFAULT_SPOT_NOTICE, "--notice")}
    elif notice is not None and not clear:
        raise typer.BadParameter("only a spot-interruption takes a notice", param_hint="--notice")
    url = f"{devcluster_url(_kubeconfig(kubeconfig))}/faults/{node}"
    answer = httpx.delete(url, timeout=10) if clear else httpx.post(url, json=body, timeout=10)
    if answer.status_code != 200:
        console().print(f"[red]error:[/] {answer.status_code}: {answer.text}")
        raise typer.Exit(1)
    console().print_json(answer.text)
