"""`tessera-devcluster serve|replay` (also `python -m tessera.devcluster`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tessera.cluster.cluster_file import ClusterFileError, default_cluster, load_cluster
from tessera.devcluster import data
from tessera.devcluster.replay import Replayer, TraceError, TracePod, load_trace
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.devcluster.sim.trainer import TrainerSettings

if TYPE_CHECKING:
    from tessera.devcluster.runner import DevCluster

#: how `tessera up` hands the devcluster its NATS URL (not on the command line, where ps shows it)
NATS_URL_ENV = "TESSERA_DEVCLUSTER_NATS_URL"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tessera-devcluster",
        description="A GPU cluster in a box: an emulated Kubernetes API server with simulated GPU nodes.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="start the API server and the simulation, and write a kubeconfig",
        description="Start the emulated API server with simulated nodes, kubelet, GPU Operator and NVML. "
        "NVML readings are served at GET /nvml/<node> and faults injected at POST /faults/<node> "
        "on the same port. Pods annotated tessera.io/checkpointable run simulated trainers that "
        "checkpoint with the checkpoint client library. Stops on Ctrl-C or SIGTERM.",
    )
    serve.add_argument(
        "--cluster",
        required=True,
        type=Path,
        help="a YAML cluster file (see examples/clusters/) or an openb node CSV",
    )
    serve.add_argument(
        "--limit", type=int, default=None, help="keep only the first N nodes of the cluster file"
    )
    serve.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(".tessera/kubeconfig"),
        help="where to write the kubeconfig (default: .tessera/kubeconfig)",
    )
    serve.add_argument(
        "--state-file",
        type=Path,
        default=None,
        help="keep every object and the simulated hardware in this JSON file (written atomically each "
        "second while something changes, and on stop) and restore it at start, so running pods go on "
        "running across a restart (default: nothing is kept)",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    serve.add_argument(
        "--speed", type=float, default=1.0, help="simulated seconds per wall-clock second (default: 1)"
    )
    serve.add_argument(
        "--pod-start-seconds",
        type=float,
        default=1.0,
        help="simulated seconds from binding to Running (default: 1)",
    )
    serve.add_argument(
        "--mig-reconfigure-seconds",
        type=float,
        default=5.0,
        help="simulated seconds the MIG manager takes to lay out GPUs (default: 5)",
    )
    serve.add_argument(
        "--default-pod-seconds",
        type=float,
        default=None,
        help="simulated seconds a pod without tessera.io/sim-duration runs before it exits 0 "
        "(default: until it is deleted)",
    )
    serve.add_argument(
        "--nats-url",
        default=os.environ.get(NATS_URL_ENV) or None,
        help="NATS of the checkpoint service: simulated trainers (pods annotated "
        "tessera.io/checkpointable) take its save requests and report their checkpoints there "
        f"(default: ${NATS_URL_ENV}; without one they still checkpoint periodically)",
    )
    serve.add_argument(
        "--checkpoint-root",
        default=None,
        help="where simulated trainers write checkpoints, a file:// or other fsspec URL "
        "(default: checkpoints/ beside the kubeconfig)",
    )
    serve.add_argument(
        "--checkpoint-interval",
        type=float,
        default=300.0,
        help="simulated seconds between a trainer's periodic checkpoints, unless its pod's "
        "tessera.io/sim-checkpoint-interval says otherwise (default: 300)",
    )
    serve.add_argument(
        "--hpa-sync-seconds",
        type=float,
        default=None,
        help="run the HorizontalPodAutoscaler controller (upstream's algorithm, sim/hpa.py) every this "
        "many simulated seconds (upstream's default: 15), reading External metrics through this API "
        "server, which proxies them to the APIService registered for external.metrics.k8s.io "
        "(default: off; `tessera up` turns it on)",
    )
    serve.add_argument(
        "--duty-cycle",
        type=Path,
        default=None,
        help="the GenAI pod_gpu_duty_cycle.csv.gz to replay for inference pods (default: "
        f"{data.GENAI_DUTY_CYCLE} in $TESSERA_DATA_DIR, else the trace bundled with the devcluster)",
    )

    replay = commands.add_parser(
        "replay",
        help="create pods from the openb pod trace at its creation times, scaled",
        description="Create pods (schedulerName tessera) from an openb pod list at the trace's creation "
        "times divided by --speed, through the Kubernetes API of --kubeconfig.",
    )
    replay.add_argument(
        "--pods",
        type=Path,
        default=None,
        help="openb_pod_list_default.csv or a slice of it (default: "
        f"{data.OPENB_PODS} in $TESSERA_DATA_DIR, else the trace bundled with the devcluster)",
    )
    replay.add_argument(
        "--speed", type=float, default=1.0, help="trace seconds per wall-clock second (default: 1)"
    )
    replay.add_argument(
        "--kubeconfig",
        type=Path,
        default=Path(".tessera/kubeconfig"),
        help="the cluster to create pods in (default: .tessera/kubeconfig)",
    )
    replay.add_argument(
        "--rate",
        type=float,
        default=None,
        help="create pods at this steady rate per wall-clock second, in trace order, instead of at "
        "their trace times (a trace without creation_time has none)",
    )
    replay.add_argument("--namespace", default="default", help="namespace of the pods (default: default)")
    replay.add_argument("--scheduler", default="tessera", help="schedulerName of the pods (default: tessera)")
    replay.add_argument("--skip", type=int, default=0, help="skip the first N pods of the trace")
    replay.add_argument("--limit", type=int, default=None, help="replay at most N pods")
    replay.add_argument("--dry-run", action="store_true", help="print what would be created, create nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return asyncio.run(_serve(args))
        return _replay(args)
    except (ClusterFileError, TraceError, ValueError) as exc:  # SnapshotError included
        print(f"tessera-devcluster: error: {exc}", file=sys.stderr)
        return 2


async def _serve(args: argparse.Namespace) -> int:
    from tessera.devcluster.runner import DevCluster

    if args.hpa_sync_seconds is not None and not args.hpa_sync_seconds > 0:
        raise ValueError(f"--hpa-sync-seconds: must be positive, got {args.hpa_sync_seconds:g}")
    settings = SimSettings(
        speed=args.speed,
        pod_start_seconds=args.pod_start_seconds,
        mig_reconfigure_seconds=args.mig_reconfigure_seconds,
        default_pod_seconds=args.default_pod_seconds,
    )
    trainer = TrainerSettings(
        nats_url=args.nats_url or None,
        storage_url=args.checkpoint_root or (args.kubeconfig.resolve().parent / "checkpoints").as_uri(),
        checkpoint_interval_s=args.checkpoint_interval,
    )
    nodes = load_cluster(args.cluster, limit=args.limit) if args.cluster else default_cluster()
    trace = DutyCycleTrace.load(args.duty_cycle)
    cluster = DevCluster(
        nodes,
        settings=settings,
        trainer=trainer,
        duty_cycle=trace,
        host=args.host,
        port=args.port,
        state_file=args.state_file,
    )
    async with cluster, _hpa_controller(cluster, args.hpa_sync_seconds):
        path = cluster.write_kubeconfig(args.kubeconfig)
        gpus = sum(len(n.gpus) for n in cluster.ctx.nodes.values())
        print(
            f"devcluster: {len(nodes)} nodes, {gpus} GPUs; API server {cluster.url}; kubeconfig {path}; "
            f"NVML {cluster.url}/nvml/<node>; speed x{args.speed:g}; checkpoints {trainer.storage_url}"
            + ("; trainers talk to the checkpoint service over NATS" if trainer.nats_url else "")
            + (
                f"; HPA controller every {args.hpa_sync_seconds:g} simulated s"
                if args.hpa_sync_seconds is not None
                else ""
            )
            + (
                f"; restored {cluster.restored} objects from {args.state_file}"
                if cluster.restored is not None
                else ""
            ),
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    return 0


HPA_MIN_REAL_PERIOD_S = 0.05
"""The HPA controller syncs at most 20 times a real second. A sync (list the HPAs, read their targets
and metrics, write their status) costs milliseconds of real time whatever the simulated clock, so at
a speed past a few hundred the simulated period would shrink below it and the controller would poll
the API server flat out, taking CPU from the API server the rest of the cluster uses."""


def hpa_real_period(sync_s: float, speed: float) -> float:
    """The real seconds between two HPA syncs: ``sync_s`` simulated seconds at ``speed``, at least
    :data:`HPA_MIN_REAL_PERIOD_S`."""
    return max(sync_s / speed, HPA_MIN_REAL_PERIOD_S)


@contextlib.asynccontextmanager
async def _hpa_controller(cluster: DevCluster, sync_s: float | None) -> AsyncIterator[None]:
    """The simulated HPA controller against the cluster's own API server, on the cluster's simulated
    clock (sync period and stabilisation windows in simulated seconds), until the block ends."""
    if sync_s is None:
        yield
        return
    from tessera.devcluster.sim.hpa import HpaController

    controller = HpaController(
        cluster.url,
        cluster.url,
        sync_s=hpa_real_period(sync_s, cluster.settings.speed),
        clock=cluster.ctx.clock.now,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(controller.run(stop))
    try:
        yield
    finally:
        stop.set()
        await task
        controller.close()


def _replay(args: argparse.Namespace) -> int:
    pods = load_trace(args.pods or data.trace(data.OPENB_PODS), skip=args.skip, limit=args.limit)
    if args.dry_run:
        create: Any = lambda manifest: print(f"would create {manifest['metadata']['name']}")  # noqa: E731
    else:
        create = _pod_creator(args.kubeconfig)

    def progress(pod: TracePod) -> None:
        print(f"created {pod.name} (trace t={pod.creation_time:g}s)", flush=True)

    replayer = Replayer(
        create, speed=args.speed, rate=args.rate, namespace=args.namespace, scheduler=args.scheduler
    )
    report = replayer.run(pods, on_created=None if args.dry_run else progress)
    print(
        f"replayed {len(report.created)} pods, {len(report.failed)} rejected; max lag {report.max_lag_s:.3f}s"
    )
    for name, reason in report.failed:
        print(f"  rejected {name}: {reason}", file=sys.stderr)
    return 0 if not report.failed else 1


def _pod_creator(kubeconfig: Path) -> Any:
    if not kubeconfig.exists():
        raise ValueError(
            f"--kubeconfig: {kubeconfig} does not exist (start `tessera-devcluster serve` first)"
        )
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]

    def create(manifest: dict[str, Any]) -> None:
        try:
            core.create_namespaced_pod(manifest["metadata"]["namespace"], cast(Any, manifest))
        except ApiException as exc:
            raise RuntimeError(f"{exc.status} {exc.reason}") from None

    return create


if __name__ == "__main__":
    raise SystemExit(main())
