"""The closed loop on a devcluster, real NATS and Postgres: the GenAI QPS trace replayed fast (one minute
of the trace every second) into two Deployments whose pods take three steps to become ready. One
is scaled by a plain HPA on the load as it is now; the other by the HPA a PredictiveAutoscaler owns, on
the forecaster's External metric (served by its metrics API route). Both HPAs are run by the devcluster's
simulation of upstream's controller. The predictive one is short on fewer steps in the same run, and
serves its forecast (not the reactive fallback) at most steps. The seeded history runs up to the
replay's first step with no gap (its last steps arrive live while the set-up waits): a gap longer than
the forecaster fills would leave it reactive for the whole replay."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from kubernetes import client

from tessera.cluster.cluster_file import NodeSpec
from tessera.core.db.migrations import migrate
from tessera.devcluster.data import GENAI_QPS, trace
from tessera.devcluster.runner import DevCluster
from tessera.devcluster.sim.context import SimSettings
from tessera.devcluster.sim.hpa import HpaController
from tessera.devcluster.sim.load import LoadGenerator
from tessera.devcluster.sim.nvml import DutyCycleTrace
from tessera.devcluster.testing import NODE, api_client, binding_scheduler, wait_for
from tessera.forecaster import bootstrap
from tessera.forecaster.config import ForecasterSettings
from tessera.forecaster.domain.series import SeriesKey, bucket
from tessera.forecaster.entrypoints.api import router
from tessera.forecaster.service_layer.dependencies import ForecasterDeps
from tessera.testing.services import running, settings_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]
CRD = ROOT / "deploy" / "crds" / "tessera.io_predictiveautoscalers.yaml"
NS = "default"
STEP_S = 1.0
POD_START_S = 3 * STEP_S
HISTORY = 270  # trace minutes seeded before the replay
PRE_ROLL = 30  # of them, the steps that arrive live during the set-up
REPLAY = 60  # the next hour: load rises from under one replica's worth to about nine
CAPACITY = 1.0  # requests per second one ready pod carries


def qps_trace() -> list[float]:
    """The GenAI QPS per minute, as bench.forecast reads it (windows summed, minutes averaged)."""
    import sys

    sys.path.insert(0, str(ROOT))
    from bench.forecast import load_series

    y, _ = load_series(trace(GENAI_QPS), "timestamp_anon", "value", False, 60.0)
    return [float(v) for v in y[: HISTORY + REPLAY]]


@pytest.fixture
def cluster() -> Iterator[DevCluster]:
    nodes = [NodeSpec(NODE, 96_000, 1_048_576, "A100-80GB", 8, 81920, {})]
    settings = SimSettings(speed=1.0, pod_start_seconds=POD_START_S)
    running_cluster = DevCluster(
        nodes, settings=settings, duty_cycle=DutyCycleTrace.synthetic(), podresources=False
    )
    running_cluster.start()
    yield running_cluster
    running_cluster.stop()


def deployment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.6.3"}]},
            },
        },
    }


def reactive_hpa() -> dict[str, Any]:
    """A plain HPA on the load now; its scale-down window is upstream's 5 minutes in the replay's time
    (5 steps), as the B4 HPA baseline has it."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "reactive"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "reactive"},
            "minReplicas": 1,
            "maxReplicas": 20,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": "load"},
                        "target": {"type": "AverageValue", "averageValue": str(CAPACITY)},
                    },
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": int(5 * STEP_S)}},
        },
    }


def predictive_autoscaler() -> dict[str, Any]:
    return {
        "apiVersion": "tessera.io/v1alpha1",
        "kind": "PredictiveAutoscaler",
        "metadata": {"name": "predictive", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "predictive"},
            "minReplicas": 1,
            "maxReplicas": 20,
            "metric": {"type": "events", "events": {"name": "requests_per_s"}, "selector": {"app": "chat"}},
            "target": CAPACITY,
            # the whole actuation lag: an HPA sync, the pods' start, and the step a forecast is behind
            "predictionWindowSeconds": int(POD_START_S + 2 * STEP_S),
        },
    }


async def first_fit(deps: ForecasterDeps, series_id: int, timeout_s: float = 180.0) -> None:
    """Until the forecaster has chosen a model on the seeded history: its first refit (and what numba
    compiles on it) is not part of the comparison, as a running forecaster has done it long before."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        async with deps.uow() as uow:
            if await uow.models.get(series_id) is not None:
                return
        await asyncio.sleep(STEP_S / 2)
    raise AssertionError(f"no model chosen within {timeout_s} s")


async def watch_sources(api: client.ApiClient, done: asyncio.Event, sources: list[str]) -> None:
    """The PredictiveAutoscaler's `status.source` once a step until `done`."""
    custom = client.CustomObjectsApi(api)
    while not done.is_set():
        found = await asyncio.to_thread(
            custom.get_namespaced_custom_object,
            "tessera.io",
            "v1alpha1",
            NS,
            "predictiveautoscalers",
            "predictive",
        )
        sources.append(str((found.get("status") or {}).get("source")))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=STEP_S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_predictive_autoscaler_is_short_on_fewer_steps_than_a_plain_hpa(
    nats_url: str, fresh_database: str, cluster: DevCluster, tmp_path: Path
) -> None:
    rates = qps_trace()
    await asyncio.to_thread(migrate, "forecaster", fresh_database)
    settings = settings_for(
        ForecasterSettings,
        nats_url,
        fresh_database,
        grpc_host="127.0.0.1",
        grpc_port=0,
        kubeconfig=cluster.write_kubeconfig(tmp_path / "kubeconfig"),
        controller_interval_s=STEP_S,
        step_s=STEP_S,
        history_h=1.0,
    )
    with api_client(cluster) as api, binding_scheduler(api):
        client.ApiextensionsV1Api(api).create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
        for name in ("reactive", "predictive"):
            client.AppsV1Api(api).create_namespaced_deployment(NS, deployment(name))
        client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(
            NS, reactive_hpa(), _preload_content=False
        )
        async with running(bootstrap.build(settings), settings) as svc:
            deps = svc.deps
            # the trace's first hours, one step each, ending at the last complete step
            # the history's last PRE_ROLL steps are stamped ahead of now: they arrive live, one a step,
            # while the set-up below waits, so the series has no gap when the replay takes over
            last = bucket(datetime.now(UTC), STEP_S) + timedelta(seconds=STEP_S * (PRE_ROLL - 1))
            key = SeriesKey.of("requests_per_s", {"app": "chat"})
            async with deps.uow() as uow:
                s = await uow.series.get_or_add(key, STEP_S, "mean", None)
                for i, value in enumerate(rates[:HISTORY]):
                    at = last - timedelta(seconds=STEP_S * (HISTORY - 1 - i))
                    await uow.observations.add(s.id, at, "", value)
                await uow.commit()

            async def record(load: float, at: datetime) -> None:
                async with deps.uow() as uow:
                    await uow.observations.add(s.id, bucket(at, STEP_S), "", load)
                    await uow.commit()

            app = FastAPI()
            app.include_router(router)
            app.state.deps = deps
            port = free_port()
            server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
            serving = asyncio.create_task(server.serve())
            replay = rates[HISTORY:]
            reactive_load = LoadGenerator(cluster.url, NS, "reactive", replay, CAPACITY, STEP_S)
            predictive_load = LoadGenerator(
                cluster.url, NS, "predictive", replay, CAPACITY, STEP_S, on_load=record
            )
            reactive_url = await reactive_load.serve()
            hpas = [
                HpaController(cluster.url, reactive_url, sync_s=STEP_S, only={f"{NS}/reactive"}),
                HpaController(
                    cluster.url, f"http://127.0.0.1:{port}", sync_s=STEP_S, only={f"{NS}/predictive"}
                ),
            ]
            stop = asyncio.Event()
            sources: list[str] = []
            replayed = asyncio.Event()
            try:
                await asyncio.to_thread(
                    client.CustomObjectsApi(api).create_namespaced_custom_object,
                    "tessera.io",
                    "v1alpha1",
                    NS,
                    "predictiveautoscalers",
                    predictive_autoscaler(),
                )

                def owned_hpa_and_first_pods() -> bool:
                    try:
                        client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(
                            "predictive", NS, _preload_content=False
                        )
                    except client.ApiException:
                        return False
                    return reactive_load.ready_pods() >= 1 and predictive_load.ready_pods() >= 1

                await asyncio.to_thread(wait_for, owned_hpa_and_first_pods, 60.0, "the owned HPA and pods")
                await first_fit(deps, s.id)
                # the replay's first step is the step after the history's last
                behind = (datetime.now(UTC) - last).total_seconds() / STEP_S
                assert behind <= 2, f"the set-up outlasted the {PRE_ROLL}-step pre-roll by {behind:.0f} steps"
                await asyncio.sleep(max(0.0, -behind * STEP_S + STEP_S))
                controllers = [asyncio.create_task(h.run(stop)) for h in hpas]
                watching = asyncio.create_task(watch_sources(api, replayed, sources))
                reactive_steps, predictive_steps = await asyncio.gather(
                    reactive_load.run(), predictive_load.run()
                )
                replayed.set()
                await watching
            finally:
                stop.set()
                replayed.set()
                server.should_exit = True
                with contextlib.suppress(Exception):
                    await serving
                await reactive_load.close()
                await predictive_load.close()
            await asyncio.gather(*controllers)
            for h in hpas:
                h.close()
            status = await asyncio.to_thread(
                client.CustomObjectsApi(api).get_namespaced_custom_object,
                "tessera.io",
                "v1alpha1",
                NS,
                "predictiveautoscalers",
                "predictive",
            )
    reactive_short = sum(step.under for step in reactive_steps)
    predictive_short = sum(step.under for step in predictive_steps)
    print(
        f"under-provisioned steps of {len(replay)}: reactive {reactive_short}, predictive {predictive_short}; "
        f"served the forecast at {sources.count('forecast')} of {len(sources)} readings"
    )
    assert any(h.scales for h in hpas[1:]), "the predictive HPA never scaled"
    # what the PredictiveAutoscaler served through the replay, read every step: mostly the forecast
    assert sources.count("forecast") > len(sources) / 2, (sources, status["status"])
    assert predictive_short < reactive_short
